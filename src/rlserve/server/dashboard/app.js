// The rlserve dashboard: follows GET /dashboard/events and draws the series the server names.
// The series names come from rlserve/server/dashboard_feed.py (TOTAL_SERIES, POLICY_SERIES), the
// one place that maps metric keys to them; CHARTS below only picks which to draw.
"use strict";

(function () {
  const CHARTS = [
    { series: "return_mean", title: "Episode return (mean of the last 100)", perPolicy: true },
    { series: "length_mean", title: "Episode length (mean of the last 100)", perPolicy: false },
    { series: "policy_loss", title: "Policy loss", perPolicy: true },
    { series: "value_loss", title: "Value loss", perPolicy: true },
    { series: "kl", title: "Approximate KL", perPolicy: true },
    { series: "entropy", title: "Entropy", perPolicy: true },
    { series: "steps_per_s", title: "Env steps per second", perPolicy: false },
  ];
  const MAX_POINTS = 4000; // thinned by half beyond this, like the server's history
  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b"];

  const state = { policies: [], points: [], charts: [], samples: 0 };
  window.rlserveDashboard = state;

  const $ = (id) => document.getElementById(id);

  function fmt(value, digits) {
    if (value === null || value === undefined) return "–";
    if (typeof value !== "number") return String(value);
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    const abs = Math.abs(value);
    if (abs !== 0 && (abs < 0.001 || abs >= 1e6)) return value.toExponential(2);
    return value.toFixed(digits === undefined ? 3 : digits);
  }

  function tick(value) {
    if (value === null) return "";
    const abs = Math.abs(value);
    if (abs === 0) return "0";
    if (abs < 0.01 || abs >= 1e6) return value.toExponential(1);
    return String(Number(value.toPrecision(4)));
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    const s = Math.floor(seconds);
    if (s < 120) return s + " s";
    if (s < 7200) return Math.floor(s / 60) + " min";
    return (s / 3600).toFixed(1) + " h";
  }

  function lines(chart) {
    return chart.perPolicy ? state.policies : ["all"];
  }

  function value(point, chart, line) {
    const source = chart.perPolicy ? (point.policies || {})[line] : point.totals;
    const v = source ? source[chart.series] : null;
    return v === undefined ? null : v;
  }

  function chartData(chart) {
    const xs = state.points.map((p) => p.env_steps);
    return [xs, ...lines(chart).map((line) => state.points.map((p) => value(p, chart, line)))];
  }

  function buildCharts() {
    const holder = $("charts");
    for (const old of state.charts) old.plot.destroy();
    holder.textContent = "";
    state.charts = CHARTS.map((chart) => {
      const box = document.createElement("div");
      box.className = "chart";
      box.id = "chart-" + chart.series;
      const title = document.createElement("h3");
      title.textContent = chart.title;
      box.appendChild(title);
      holder.appendChild(box);
      const series = [{ label: "env steps" }].concat(
        lines(chart).map((line, i) => ({
          label: line,
          stroke: COLOURS[i % COLOURS.length],
          width: 1.5,
          spanGaps: true,
        }))
      );
      const plot = new uPlot(
        {
          width: Math.max(300, box.clientWidth - 12),
          height: 220,
          scales: { x: { time: false } },
          axes: [{ label: "env steps" }, { size: 64, values: (u, splits) => splits.map(tick) }],
          series: series,
        },
        chartData(chart),
        box
      );
      return { spec: chart, plot: plot, box: box };
    });
  }

  function redraw() {
    for (const chart of state.charts) {
      const data = chartData(chart.spec);
      chart.plot.setData(data);
      let points = 0;
      for (let i = 1; i < data.length; i++) points += data[i].filter((v) => v !== null).length;
      chart.box.dataset.points = String(points);
    }
  }

  function addPoint(point) {
    state.points.push(point);
    if (state.points.length > MAX_POINTS) state.points = state.points.filter((_, i) => i % 2 === 0);
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const cell of cells) {
      const td = document.createElement("td");
      td.textContent = cell;
      tr.appendChild(td);
    }
    return tr;
  }

  function fillTables(sample) {
    const policies = $("policies").tBodies[0];
    policies.replaceChildren(
      ...state.policies.map((pid) => {
        const p = sample.policies[pid] || {};
        const ckpt = (sample.checkpoints || {})[pid];
        return row([
          pid, fmt(p.weights_version), fmt(p.return_mean, 1), fmt(p.policy_loss),
          fmt(p.value_loss), fmt(p.kl, 4), fmt(p.entropy), fmt(p.updates),
          fmt(p.steps_trained), ckpt ? ckpt.name + " (" + duration(ckpt.age_s) + " ago)" : "none yet",
        ]);
      })
    );
    const t = sample.totals;
    $("server").tBodies[0].replaceChildren(
      row(["health", sample.health.status]),
      row(["episodes completed", fmt(t.episodes_completed)]),
      row(["open episodes", fmt(t.episodes_open)]),
      row(["return (all policies)", fmt(t.return_mean, 1)]),
      row(["episode length", fmt(t.length_mean, 1)]),
      row(["learner restarts", fmt(t.learner_restarts)]),
      row(["learner lag (steps)", fmt(t.learner_lag_steps)]),
      row(["steps queued for the learner", fmt(t.steps_queued)]),
      row(["error replies", fmt(t.errors)])
    );
    $("clients").tBodies[0].replaceChildren(
      ...sample.clients.map((c) =>
        row([c.client, c.name || "–", fmt(c.requests_per_s, 1), fmt(c.requests),
          fmt(c.open_episodes), duration(c.idle_s)])
      )
    );
  }

  function fillHeader(sample) {
    const t = sample.totals;
    $("env-steps").textContent = fmt(t.env_steps);
    $("steps-per-s").textContent = fmt(t.steps_per_s, 0);
    $("weights-version").textContent = fmt(t.weights_version);
    $("clients-count").textContent = fmt(t.clients);
    $("episodes-open").textContent = fmt(t.episodes_open);
    $("uptime").textContent = duration(t.uptime_s);
    const health = $("health");
    health.textContent = sample.health.status;
    health.className = "pill " + (sample.health.status === "ok" ? "ok" : "bad");
    const problems = Object.entries(sample.health.problems || {});
    $("problems").hidden = problems.length === 0;
    $("problems").textContent = problems.map(([part, why]) => part + ": " + why).join(" · ");
    state.samples += 1;
    $("samples").textContent = String(state.samples);
    $("updated").textContent = new Date().toLocaleTimeString();
  }

  function show(sample) {
    fillHeader(sample);
    fillTables(sample);
    redraw();
  }

  function connect() {
    const link = $("link");
    const events = new EventSource("/dashboard/events");
    events.addEventListener("opening", (e) => {
      const opening = JSON.parse(e.data);
      state.policies = opening.policies;
      state.points = [];
      opening.history.forEach(addPoint);
      buildCharts();
      show(opening.latest);
      link.textContent = "live";
      link.className = "pill ok";
    });
    events.addEventListener("sample", (e) => {
      const sample = JSON.parse(e.data);
      addPoint({ env_steps: sample.env_steps, totals: sample.totals, policies: sample.policies });
      show(sample);
    });
    events.onerror = () => {
      // EventSource reconnects by itself; a signed-out page (401) stops, so reload to sign in.
      link.textContent = events.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting";
      link.className = "pill bad";
      if (events.readyState === EventSource.CLOSED) setTimeout(() => location.reload(), 5000);
    };
  }

  window.addEventListener("resize", () => {
    for (const chart of state.charts) {
      chart.plot.setSize({ width: Math.max(300, chart.box.clientWidth - 12), height: 220 });
    }
  });
  connect();
})();
