// The forward pass and the action rules against docs/protocol-vectors/*forward-pass.json,
// within each file's stated tolerance (integers exactly).
#include <cmath>
#include <cstdio>
#include <string>

#include "check.hpp"
#include "rlserve/distributions.hpp"
#include "rlserve/model.hpp"
#include "scripted.hpp"
#include "vectors.hpp"

using vectors::Json;

namespace {

double g_rtol = 0, g_atol = 0;

void close(const std::vector<double>& got, const Json& want, const std::string& what) {
  const auto w = vectors::numbers(want);
  if (got.size() != w.size()) {
    check::fail(__FILE__, __LINE__, what + ": " + std::to_string(got.size()) + " values, want " + std::to_string(w.size()));
    return;
  }
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (!check::near(got[i], w[i], g_rtol, g_atol)) {
      check::fail(__FILE__, __LINE__, what + "[" + std::to_string(i) + "] = " + std::to_string(got[i]) +
                                          ", want " + std::to_string(w[i]));
    }
  }
}

void close(const std::vector<float>& got, const Json& want, const std::string& what) {
  close(std::vector<double>(got.begin(), got.end()), want, what);
}

void close(double got, double want, const std::string& what) {
  CHECK(check::near(got, want, g_rtol, g_atol), what + " = " + std::to_string(got) + ", want " + std::to_string(want));
}

rlserve::Model parse(const Json& p) {
  auto m = rlserve::Model::parse(vectors::from_tagged(p.at("model")), vectors::from_tagged(p.at("arrays")));
  if (!m) {
    std::fprintf(stderr, "%s: %s\n", p.at("name").get<std::string>().c_str(), m.error().message.c_str());
    std::exit(1);
  }
  return std::move(m).value();
}

struct Pass {
  std::vector<float> y;
  std::vector<std::uint8_t> legal;
  rlserve::ForwardTrace trace;
  std::vector<float> state;
};

Pass run(const rlserve::Model& m, const Json& obs, std::vector<float> state = {}) {
  Pass r;
  std::vector<float> o;
  for (double v : vectors::numbers(obs)) o.push_back(static_cast<float>(v));
  CHECK(o.size() == m.obs_dim(), "observation length");
  if (state.empty()) state.assign(m.state_size(), 0.0f);
  r.state.assign(m.state_size(), 0.0f);
  m.forward(o.data(), state.data(), r.state.data(), r.y, r.legal, &r.trace);
  return r;
}

rlserve::Action act(const rlserve::Model& m, const Pass& r, bool explore, Scripted& s) {
  auto a = rlserve::choose_action(m.head(), r.y, r.legal, explore, s);
  if (!a) {
    check::fail(__FILE__, __LINE__, "choose_action: " + a.error().message);
    return {};
  }
  return std::move(a).value();
}

/// Each choice's log-probability (NaN where log_probability refuses it).
std::vector<double> choice_logps(const rlserve::Model& m, const Pass& r) {
  std::vector<double> out;
  for (std::size_t j = 0; j < m.head().action_dim; ++j) {
    auto lp = rlserve::log_probability(m.head(), r.y, r.legal, {static_cast<double>(j)});
    out.push_back(lp ? *lp : NAN);
  }
  return out;
}

void categorical_and_greedy(const rlserve::Model& m, const Pass& r, const Json& p, const std::string& name) {
  Scripted none;
  const auto g = act(m, r, false, none);
  CHECK(g.row.size() == 1 && g.row[0] == p.at("greedy_choice").get<double>(), name + ": greedy_choice");
  CHECK(g.env.size() == 1 && g.env[0] == p.at("greedy_action").get<double>(), name + ": greedy_action");
  if (p.contains("log_probabilities")) {
    const auto lps = choice_logps(m, r);
    const auto want = vectors::numbers(p.at("log_probabilities"));
    for (std::size_t j = 0; j < want.size(); ++j) {
      if (std::isnan(want[j])) CHECK(std::isnan(lps[j]), name + ": an illegal choice has a log-probability");
      else close(lps[j], want[j], name + ": log_probabilities[" + std::to_string(j) + "]");
    }
  }
  if (p.contains("uniform_draw")) {
    Scripted s;
    s.uniforms = {p.at("uniform_draw").get<double>()};
    const auto a = act(m, r, true, s);
    CHECK(a.row.size() == 1 && a.row[0] == p.at("sampled_choice").get<double>(), name + ": sampled_choice");
    CHECK(a.env.size() == 1 && a.env[0] == p.at("sampled_action").get<double>(), name + ": sampled_action");
    close(a.logp, p.at("sampled_log_probability").get<double>(), name + ": sampled_log_probability");
  }
}

void epsilon_steps(const rlserve::Model& m, const Pass& r, const Json& steps, const std::string& name,
                   std::size_t legal_count) {
  for (const auto& st : steps) {
    Scripted s;
    s.uniforms = {st.at("explore_draw").get<double>()};
    // uniform_choice is a choice index: the uniform draw in the middle of its slot picks it.
    if (st.contains("uniform_choice")) s.uniforms.push_back((st.at("uniform_choice").get<double>() + 0.5) / static_cast<double>(legal_count));
    if (st.contains("legal_draw")) s.uniforms.push_back(st.at("legal_draw").get<double>());
    const auto a = act(m, r, true, s);
    CHECK(a.row.size() == 1 && a.row[0] == st.at("choice").get<double>(), name + ": exploring step choice");
    CHECK(a.env.size() == 1 && a.env[0] == st.at("action").get<double>(), name + ": exploring step action");
    close(a.logp, st.at("log_probability").get<double>(), name + ": exploring step log_probability");
  }
}

void forward_pass(const Json& file) {
  for (const auto& p : file.at("policies")) {
    const std::string name = p.at("name").get<std::string>();
    const auto m = parse(p);
    const Pass r = run(m, p.at("observation"));
    close(r.trace.hidden, p.at("hidden"), name + ": hidden");
    if (p.contains("normalized_observation")) close(r.trace.network_input, p.at("normalized_observation"), name + ": normalized_observation");
    Scripted none;
    if (name == "tiny_categorical") {
      close(r.y, p.at("logits"), name + ": logits");
      categorical_and_greedy(m, r, p, name);
    } else if (name == "tiny_gaussian" || name == "tiny_gaussian_normalized") {
      close(r.y, p.at("mean"), name + ": mean");
      close(m.head().log_std, p.at("log_std"), name + ": log_std");
      const auto action = vectors::numbers(p.at("action"));
      auto lp = rlserve::log_probability(m.head(), r.y, r.legal, action);
      CHECK(lp.ok(), name + ": log_probability of the given action");
      if (lp) close(*lp, p.at("action_log_probability").get<double>(), name + ": action_log_probability");
      // Sampling with the normal draws that give the vector's action reproduces it and its clip.
      Scripted s;
      const auto u = p.contains("normalized_action") ? vectors::numbers(p.at("normalized_action")) : action;
      if (p.contains("normalized_action")) {
        for (std::size_t j = 0; j < action.size(); ++j) {
          close((action[j] - m.head().bias[j]) / m.head().scale[j], u[j], name + ": normalized_action");
        }
      }
      for (std::size_t j = 0; j < u.size(); ++j) s.normals.push_back((u[j] - r.y[j]) / std::exp(m.head().log_std[j]));
      const auto a = act(m, r, true, s);
      close(a.row, p.at("action"), name + ": sampled row");
      close(a.env, p.at("clipped_action"), name + ": clipped_action");
      close(a.logp, p.at("action_log_probability").get<double>(), name + ": sampled logp");
      if (p.contains("greedy_action")) close(act(m, r, false, none).row, p.at("greedy_action"), name + ": greedy_action");
    } else if (name == "tiny_epsilon_greedy") {
      close(r.y, p.at("q_values"), name + ": q_values");
      categorical_and_greedy(m, r, p, name);
      epsilon_steps(m, r, p.at("exploring_steps"), name, m.head().action_dim);
    } else if (name == "tiny_squashed_gaussian") {
      close(r.y, p.at("output"), name + ": output");
      Scripted s;
      s.normals.assign(p.at("noise").begin(), p.at("noise").end());
      const auto a = act(m, r, true, s);
      close(a.row, p.at("action"), name + ": action");
      close(a.env, p.at("action"), name + ": action sent");
      close(a.logp, p.at("action_log_probability").get<double>(), name + ": action_log_probability");
      auto lp = rlserve::log_probability(m.head(), r.y, r.legal, vectors::numbers(p.at("action")));
      CHECK(lp.ok(), name + ": log_probability of the action");
      // The action is float32-rounded, so its log-density moves a little near the bound.
      if (lp) CHECK(std::fabs(*lp - p.at("action_log_probability").get<double>()) < 1e-3, name + ": log_probability of the action");
      const auto g = act(m, r, false, none);
      close(g.row, p.at("greedy_action"), name + ": greedy_action");
      close(g.logp, p.at("greedy_log_probability").get<double>(), name + ": greedy_log_probability");
    } else {
      CHECK(false, "no check written for policy " + name);
    }
    std::printf("forward-pass.json: %s checked\n", name.c_str());
  }
}

void conv_pass(const Json& file) {
  for (const auto& p : file.at("policies")) {
    const std::string name = p.at("name").get<std::string>();
    const auto m = parse(p);
    const Pass r = run(m, p.at("observation"));
    close(r.trace.encoded, p.at("features"), name + ": features");
    close(r.y, p.at("logits"), name + ": logits");
    categorical_and_greedy(m, r, p, name);
    std::printf("conv-forward-pass.json: %s checked\n", name.c_str());
  }
}

void lstm_pass(const Json& file) {
  for (const auto& p : file.at("policies")) {
    const std::string name = p.at("name").get<std::string>();
    const auto m = parse(p);
    CHECK(m.state_size() == 4, name + ": state_size");
    std::vector<float> state(m.state_size(), 0.0f);
    int k = 0;
    for (const auto& st : p.at("steps")) {
      const std::string step = name + " step " + std::to_string(k++);
      close(state, st.at("state_in"), step + ": state_in");
      const Pass r = run(m, st.at("observation"), state);
      close(r.trace.gates, st.at("gates"), step + ": gates");
      close(r.state, st.at("state_out"), step + ": state_out");
      close(r.y, st.at("logits"), step + ": logits");
      categorical_and_greedy(m, r, st, step);
      state = r.state;
    }
    std::printf("lstm-forward-pass.json: %s checked (%d steps)\n", name.c_str(), k);
  }
}

void masked_pass(const Json& file) {
  for (const auto& p : file.at("policies")) {
    const std::string name = p.at("name").get<std::string>();
    const auto m = parse(p);
    CHECK(m.has_mask(), name + ": has_mask");
    int k = 0;
    for (const auto& st : p.at("steps")) {
      const std::string step = name + " step " + std::to_string(k++);
      const Pass r = run(m, st.at("observation"));
      std::vector<double> legal(r.legal.begin(), r.legal.end());
      std::vector<double> want_legal;
      for (const auto& l : st.at("legal")) want_legal.push_back(l.get<bool>() ? 1.0 : 0.0);
      CHECK(legal == want_legal, step + ": legal");
      close(r.trace.network_input, st.at("features"), step + ": features");
      close(r.y, st.at("masked_outputs"), step + ": masked_outputs");
      categorical_and_greedy(m, r, st, step);
      if (st.contains("exploring_steps")) {
        epsilon_steps(m, r, st.at("exploring_steps"), step, st.at("legal_count").get<std::size_t>());
      }
    }
    const Pass refused = run(m, p.at("refused").at("observation"));
    Scripted s;
    s.uniforms = {0.5, 0.5};
    auto a = rlserve::choose_action(m.head(), refused.y, refused.legal, true, s);
    CHECK(!a.ok() && a.error().code == rlserve::ErrorCode::bad_value &&
              a.error().message == p.at("refused").at("error").get<std::string>(),
          name + ": an observation with no legal choice is refused");
    std::printf("masked-forward-pass.json: %s checked (%d steps)\n", name.c_str(), k);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_forward <docs/protocol-vectors folder>\n");
    return 2;
  }
  const std::string dir = argv[1];
  const char* files[] = {"forward-pass.json", "conv-forward-pass.json", "lstm-forward-pass.json",
                         "masked-forward-pass.json"};
  for (const char* f : files) {
    const auto file = vectors::load(dir + "/" + f);
    g_rtol = file.at("tolerance").at("rtol").get<double>();
    g_atol = file.at("tolerance").at("atol").get<double>();
    const std::string name = f;
    if (name == "forward-pass.json") forward_pass(file);
    else if (name == "conv-forward-pass.json") conv_pass(file);
    else if (name == "lstm-forward-pass.json") lstm_pass(file);
    else masked_pass(file);
  }
  std::printf("tolerance: rtol %g, atol %g\n", g_rtol, g_atol);
  return check::finish("test_forward");
}
