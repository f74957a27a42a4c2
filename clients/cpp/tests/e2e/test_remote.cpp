// End to end against a real `rlserve serve` (CartPole-v1 spaces, a token, 127.0.0.1, port 0):
// CartPole episodes stepped in C++ with remote inference (single, batched, from four threads on
// one client, multi-agent), the examples, a wrong-shape observation, a bad token, exactly-once
// after lost replies, and a server killed with SIGKILL and resumed on the same port.
// Usage: test_e2e_remote <python bin dir> <hello> <hello_c> <c_abi_episodes>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "../../examples/cartpole.hpp"
#include "../check.hpp"
#include "rlserve/client.hpp"
#include "harness.hpp"
#include "server_process.hpp"

namespace {

const char* kToken = "cpp-e2e-secret";

struct Context {
  std::string bin_dir, hello, hello_c, c_abi, work;
  std::unique_ptr<e2e::ServerProcess> server;
};

std::unique_ptr<rlserve::Client> connect(const Context& ctx, bool check_observations = true, double request_s = 30,
                                         double reconnect_s = 60) {
  rlserve::ClientOptions o;
  o.token = kToken;
  o.client_name = "cpp-e2e";
  o.timeouts.request = request_s;
  o.timeouts.reconnect = reconnect_s;
  o.check_observations = check_observations;
  auto c = rlserve::Client::connect(ctx.server->address(), o);
  if (!c) throw std::runtime_error("connect failed: " + c.error().message);
  return std::move(*c);
}

nlohmann::json metrics(const Context& ctx) { return e2e::metrics(*ctx.server, kToken); }

nlohmann::json wait_metrics(const Context& ctx, const std::function<bool(const nlohmann::json&)>& ready) {
  return e2e::wait_metrics(*ctx.server, kToken, ready, 200);
}

using e2e::metric;
using e2e::play;
using e2e::vec;

void bad_token(const Context& ctx) {
  for (const std::string token : {"wrong-token", ""}) {
    rlserve::ClientOptions o;
    o.token = token;
    auto c = rlserve::Client::connect(ctx.server->address(), o);
    CHECK(!c.ok(), "a bad token is refused");
    if (c) continue;
    CHECK(c.error().code == rlserve::ErrorCode::unauthorized, "unauthorized, got " + c.error().message);
    CHECK(c.error().message.find("token") != std::string::npos, "the server's message names the token: " + c.error().message);
  }
}

/// Right after the start the first get_action waits for the learner's first weights, longer
/// than this client's 0.5 s reply timeout: it reconnects and re-sends, and the re-sent call
/// joins the waiting one.
void short_timeout(const Context& ctx) {
  auto client = connect(ctx, true, 0.5, 60);
  const std::vector<float> obs{0.01f, -0.02f, 0.03f, 0.04f};
  auto id = client->start_episode();
  auto a = client->get_action(*id, obs);
  CHECK(a.ok(), "the first action despite the short timeout: " + (a ? "" : a.error().message));
  CHECK(client->end_episode(*id, obs).ok() && client->close().ok(), "end");
}

void episodes(const Context& ctx) {
  auto client = connect(ctx);
  const auto before = metrics(ctx);
  int total = 0;
  for (std::uint64_t seed = 1; seed <= 3; ++seed) total += play(*client, seed);
  // Batched: two CartPoles stepped together, one round trip per step.
  cartpole::CartPole a(11), b(12);
  std::vector<std::array<float, 4>> obs{a.reset(), b.reset()};
  auto first = client->start_episode(), second = client->start_episode();
  CHECK(first.ok() && second.ok(), "two episodes for a batch");
  if (!first || !second) return;
  std::vector<std::string> ids{*first, *second};
  for (int t = 0; t < 5; ++t) {
    std::vector<rlserve::Value> values;
    for (const auto& o : obs) values.push_back(*client->observation_value(vec(o)));
    auto actions = client->get_actions(ids, values);
    CHECK(actions.ok() && actions->size() == 2, "batched get_action: " + (actions ? "" : actions.error().message));
    if (!actions) return;
    obs = {a.step(static_cast<int>((*actions)[0].discrete())).observation,
           b.step(static_cast<int>((*actions)[1].discrete())).observation};
    for (const auto& id : ids) client->log_returns(id, 1.0);
  }
  for (std::size_t i = 0; i < 2; ++i) CHECK(client->end_episode(ids[i], vec(obs[i]), true).ok(), "end batched");
  CHECK(client->close().ok(), "close settles the pipelined end_episode");
  const double done = metric(before, "episodes/completed") + 5;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return metric(m, "episodes/completed") >= done; });
  CHECK(metric(after, "episodes/completed") == done, "5 episodes completed");
  CHECK(metric(after, "samples/env_steps") - metric(before, "samples/env_steps") == total + 10,
        "every step recorded once: " + std::to_string(total + 10));
}

void threads(const Context& ctx) {
  auto client = connect(ctx);
  const auto before = metrics(ctx);
  std::vector<std::thread> players;
  std::vector<int> lengths(4, 0);
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    players.emplace_back([&, i] { lengths[i] = play(*client, 20 + i); });
  }
  for (auto& t : players) t.join();
  int total = 0;
  for (int n : lengths) total += n;
  CHECK(client->close().ok(), "close");
  const double completed = metric(before, "episodes/completed") + 4;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return metric(m, "episodes/completed") >= completed; });
  CHECK(metric(after, "samples/env_steps") - metric(before, "samples/env_steps") == total,
        "4 threads on one client: every step once");
}

void wrong_shape(const Context& ctx) {
  auto client = connect(ctx);
  auto id = client->start_episode();
  CHECK(id.ok(), "start");
  auto short_obs = client->get_action(*id, std::vector<float>{0.0f, 0.1f, 0.2f});
  CHECK(!short_obs && short_obs.error().code == rlserve::ErrorCode::bad_value, "3 numbers for Box(4,) is bad_value");
  if (!short_obs) CHECK(short_obs.error().message.find("Box") != std::string::npos, short_obs.error().message);
  float three[3] = {0, 0, 0};
  rlserve::Value wrong(rlserve::NDArray::from_floats(three, {3}));
  auto checked = client->get_action(*id, wrong);
  CHECK(!checked && checked.error().code == rlserve::ErrorCode::bad_value, "a (3,) array is bad_value");
  if (!checked) {
    CHECK(checked.error().message.find("episode '" + *id + "'") != std::string::npos, checked.error().message);
    CHECK(checked.error().message.find("(4,)") != std::string::npos, "names the expected shape: " + checked.error().message);
  }
  // Unchecked, the server refuses it with its own message; the episode carries on.
  auto raw = connect(ctx, false);
  auto rid = raw->start_episode();
  auto server_says = raw->get_action(*rid, wrong);
  CHECK(!server_says && server_says.error().code == rlserve::ErrorCode::bad_value, "the server's bad_value");
  if (!server_says) CHECK(server_says.error().message.find("(4,)") != std::string::npos, server_says.error().message);
  for (auto* c : {client.get(), raw.get()}) {
    const std::string& eid = c == client.get() ? *id : *rid;
    auto good = c->get_action(eid, std::vector<float>{0.01f, 0.0f, 0.02f, 0.0f});
    CHECK(good.ok(), "the episode carries on after a refused observation");
    CHECK(c->end_episode(eid, std::vector<float>{0.01f, 0.0f, 0.02f, 0.0f}).ok(), "end");
    CHECK(c->close().ok(), "close");
  }
}

void exactly_once(const Context& ctx) {
  auto client = connect(ctx);
  const auto before = metrics(ctx);
  const std::vector<float> obs{0.01f, -0.02f, 0.03f, 0.04f};
  auto id = client->start_episode();
  CHECK(client->get_action(*id, obs).ok(), "first get_action");
  client->log_returns(*id, 5.0);
  client->drop_next_reply();
  auto second = client->get_action(*id, obs);  // applied, its reply lost, re-sent: answered once
  CHECK(second.ok(), "the re-sent get_action is answered: " + (second ? "" : second.error().message));
  client->drop_next_reply();
  auto logged = client->log_action(*id, *client->observation_value(obs), rlserve::Value(std::int64_t{1}));
  CHECK(logged.ok(), "the re-sent log_action is answered");
  CHECK(client->end_episode(*id, obs).ok(), "end");
  CHECK(client->close().ok(), "close");
  CHECK(client->reconnects() == 2, "reconnected twice, got " + std::to_string(client->reconnects()));
  const double done = metric(before, "episodes/completed") + 1;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return metric(m, "episodes/completed") >= done; });
  CHECK(metric(after, "samples/env_steps") - metric(before, "samples/env_steps") == 3,
        "3 steps, not 4 or 5: " + std::to_string(metric(after, "samples/env_steps") - metric(before, "samples/env_steps")));
}

void multi_agent(const Context& ctx) {
  auto client = connect(ctx);
  const auto before = metrics(ctx);
  rlserve::Value obs = *client->observation_value({0.01f, -0.02f, 0.03f, 0.04f});
  auto id = client->start_episode();
  auto both = client->get_agent_actions(*id, {{"a", obs}, {"b", obs}});
  CHECK(both.ok() && both->size() == 2, "two agents act: " + (both ? "" : both.error().message));
  if (both) CHECK(both->at("b").discrete() == 0 || both->at("b").discrete() == 1, "agent b's Discrete(2) action");
  auto done = client->log_agent_returns(*id, {{"a", 1.0}, {"b", 0.5}}, {{"b", true}});
  CHECK(done.ok(), "rewards, and b terminated: " + (done ? "" : done.error().message));
  auto named_again = client->get_agent_actions(*id, {{"b", obs}});
  CHECK(!named_again && named_again.error().code == rlserve::ErrorCode::episode_error, "a done agent may not act");
  auto one = client->get_agent_actions(*id, {{"a", obs}});
  CHECK(one.ok() && one->count("a") == 1, "agent a acts on");
  CHECK(client->end_agent_episode(*id, {{"a", obs}}).ok(), "end");
  CHECK(client->close().ok(), "close");
  const double completed = metric(before, "episodes/completed") + 1;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return metric(m, "episodes/completed") >= completed; });
  CHECK(metric(after, "episodes/completed") == completed, "the multi-agent episode completed");
}

void examples(const Context& ctx) {
  for (const std::string& program : {ctx.hello, ctx.hello_c}) {
    for (const bool with_token : {true, false}) {  // without it the server refuses them, clearly
      const std::string out = ctx.work + "/example.out";
      const std::string command = (with_token ? std::string("RLSERVE_TOKEN=") + kToken : std::string("RLSERVE_TOKEN=")) +
                                  " " + program + " " + ctx.server->address() + " > " + out + " 2>&1";
      const int rc = std::system(command.c_str());
      std::ifstream in(out);
      const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      if (with_token) {
        CHECK(rc == 0 && text.find("episode return: ") != std::string::npos, program + ": " + text);
      } else {
        CHECK(rc != 0 && text.find("token") != std::string::npos, program + " without the token: " + text);
      }
    }
  }
}

/// The C ABI's client calls from C (tests/e2e/c_abi_episodes.c): log_action and info, batched
/// calls and a multi-agent episode with a done mark, each step recorded once.
void c_abi_calls(const Context& ctx) {
  const auto before = metrics(ctx);
  const auto [rc, text] = e2e::run_program(std::string("RLSERVE_TOKEN=") + kToken + " " + ctx.c_abi + " " +
                                               ctx.server->address() + " remote", ctx.work + "/c_abi.out");
  const int steps = e2e::steps_printed(text);
  CHECK(rc == 0 && steps > 0, "c_abi_episodes: " + text);
  const double completed = metric(before, "episodes/completed") + 4;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return metric(m, "episodes/completed") >= completed; });
  CHECK(metric(after, "episodes/completed") == completed, "4 episodes completed (one multi-agent)");
  CHECK(metric(after, "samples/env_steps") - metric(before, "samples/env_steps") == steps,
        "every step once: " + std::to_string(metric(after, "samples/env_steps") - metric(before, "samples/env_steps")) +
            " of " + std::to_string(steps));
}

void restart(Context& ctx) {
  auto client = connect(ctx);
  auto old = client->start_episode();
  const std::vector<float> obs{0.01f, -0.02f, 0.03f, 0.04f};
  CHECK(client->get_action(*old, obs).ok(), "before the kill");
  const int port = ctx.server->port();
  const std::string run = ctx.server->run_folder();
  ctx.server->kill9();
  ctx.server.reset();
  ctx.server = std::make_unique<e2e::ServerProcess>(
      ctx.bin_dir,
      std::vector<std::string>{"--resume", run, "--port", std::to_string(port), "--http-port", "0", "--no-progress",
                               "--ppo-device", "cpu"},
      std::vector<std::string>{std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/server-2.log");
  CHECK(ctx.server->port() == port, "resumed on the same port");
  auto lost = client->get_action(*old, obs);
  CHECK(!lost && lost.error().code == rlserve::ErrorCode::episode_lost, "the open episode is lost");
  if (!lost) CHECK(lost.error().message.find("start a new episode") != std::string::npos, lost.error().message);
  CHECK(client->reconnects() == 1, "reconnected once, got " + std::to_string(client->reconnects()));
  CHECK(play(*client, 7) > 0, "a new episode runs on the resumed server");
  CHECK(client->close().ok(), "close");
}

/// A pipelined start the server never answered, and no server to re-send it to: the call that
/// finds the connection lost gives up after the reconnect timeout, and the episode's next call
/// says it is lost (the server may never have seen it). Stops the server: the last case.
void give_up(Context& ctx) {
  auto connected = connect(ctx, true, 30, 1);
  auto& client = *connected;
  const std::vector<float> obs{0.01f, -0.02f, 0.03f, 0.04f};
  ctx.server->suspend();  // it reads nothing: the start below is never answered
  auto id = client.start_episode();
  CHECK(id.ok(), "a random id's start is sent without waiting");
  if (!id) return;
  ctx.server->kill9();
  ctx.server.reset();
  auto gone = client.get_action(*id, obs);
  CHECK(!gone && gone.error().code == rlserve::ErrorCode::connection_lost,
        "the server is gone: " + (gone ? std::string("answered") : gone.error().message));
  auto lost = client.get_action(*id, obs);
  CHECK(!lost && lost.error().code == rlserve::ErrorCode::episode_lost,
        "the unconfirmed episode is lost: " + (lost ? std::string("answered") : lost.error().message));
  if (!lost) CHECK(lost.error().message.find("sent without waiting") != std::string::npos, lost.error().message);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s <python bin dir> <hello> <hello_c> <c_abi_episodes>\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/rlserve-cpp-e2e-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 2;
  Context ctx{argv[1], argv[2], argv[3], argv[4], tmpl, nullptr};
  try {
    ctx.server = std::make_unique<e2e::ServerProcess>(
        ctx.bin_dir,
        std::vector<std::string>{"--spaces-from", "CartPole-v1", "--run-dir", ctx.work, "--name", "run", "--port", "0",
                                 "--http-port", "0", "--no-progress", "--ppo-device", "cpu", "--seed", "1"},
        std::vector<std::string>{std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/server-1.log");
    e2e::run_cases({
        {"bad_token", [&] { bad_token(ctx); }},
        {"short_timeout", [&] { short_timeout(ctx); }},
        {"episodes", [&] { episodes(ctx); }},
        {"threads", [&] { threads(ctx); }},
        {"wrong_shape", [&] { wrong_shape(ctx); }},
        {"exactly_once", [&] { exactly_once(ctx); }},
        {"multi_agent", [&] { multi_agent(ctx); }},
        {"examples", [&] { examples(ctx); }},
        {"c_abi_calls", [&] { c_abi_calls(ctx); }},
        {"restart", [&] { restart(ctx); }},
        {"give_up", [&] { give_up(ctx); }},
    });
  } catch (const std::exception& e) {
    check::fail(__FILE__, __LINE__, e.what());
  }
  if (check::failures() != 0 && ctx.server) std::fprintf(stderr, "server log:\n%s\n", ctx.server->log().c_str());
  ctx.server.reset();  // killed, its whole process group
  if (check::failures() == 0) std::filesystem::remove_all(ctx.work);
  return check::finish("e2e_remote");
}
