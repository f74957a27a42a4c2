// End to end against a real `rlserve serve` (CartPole-v1 spaces, PPO with a small train batch,
// 127.0.0.1, port 0) with local inference: every step taken reaches the server once (counted
// by its samples/steps_reported), a re-sent batch after a lost reply counts once, the weights
// refresh picks up the learner's newer versions (fetching only changed ones), and a server
// killed with SIGKILL and resumed on the same port while batches wait loses no step.
// Usage: test_e2e_local <python bin dir> <c_abi_episodes>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "../../examples/cartpole.hpp"
#include "../check.hpp"
#include "rlserve.h"
#include "rlserve/local_client.hpp"
#include "harness.hpp"
#include "server_process.hpp"

namespace {

const char* kToken = "cpp-e2e-local";

struct Context {
  std::string bin_dir, c_abi, work;
  std::unique_ptr<e2e::ServerProcess> server;
};

std::unique_ptr<rlserve::LocalClient> connect(const Context& ctx, rlserve::LocalOptions o) {
  o.token = kToken;
  o.client_name = "cpp-e2e-local";
  o.timeouts.request = 30;
  if (o.timeouts.reconnect == rlserve::Timeouts{}.reconnect) o.timeouts.reconnect = 60;
  o.seed = 7;
  auto c = rlserve::LocalClient::connect(ctx.server->address(), o);
  if (!c) throw std::runtime_error("connect failed: " + c.error().message);
  return std::move(*c);
}

nlohmann::json metrics(const Context& ctx) { return e2e::metrics(*ctx.server, kToken); }

nlohmann::json wait_metrics(const Context& ctx, const std::function<bool(const nlohmann::json&)>& ready) {
  return e2e::wait_metrics(*ctx.server, kToken, ready, 300);
}

using e2e::metric;
using e2e::play;
using e2e::vec;

double reported(const nlohmann::json& m) { return metric(m, "samples/steps_reported"); }

/// Episodes cut into fragments of 16 steps and batches of 64: every step counted once.
void steps_counted(const Context& ctx) {
  rlserve::LocalOptions o;
  o.fragment_length = 16;
  o.batch_steps = 64;
  o.flush_interval = 0.2;
  auto client = connect(ctx, o);
  const auto before = metrics(ctx);
  int total = 0;
  for (std::uint64_t seed = 1; seed <= 6; ++seed) total += play(*client, seed);
  // One more that never trains: it acts and records no step; its summary counts its one step.
  auto quiet = client->start_episode("", false);
  CHECK(quiet.ok() && client->get_action(*quiet, std::vector<float>{0.01f, 0, 0, 0}).ok(), "a non-training episode acts");
  CHECK(client->end_episode(*quiet, std::vector<float>{0.01f, 0, 0, 0}).ok(), "and ends");
  CHECK(client->counts().steps_taken == static_cast<std::uint64_t>(total), "steps taken");
  auto closed = client->close();
  CHECK(closed.ok(), "close ships everything: " + (closed ? "" : closed.error().message));
  const auto c = client->counts();
  CHECK(c.steps_shipped == static_cast<std::uint64_t>(total), "shipped " + std::to_string(c.steps_shipped) + " of " + std::to_string(total));
  CHECK(c.batches_sent >= 2 && c.duplicates == 0, "several batches, none a duplicate");
  const double want = reported(before) + total;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return reported(m) >= want; });
  CHECK(reported(after) == want, "the server counts every step once: " + std::to_string(reported(after) - reported(before)) +
                                     " of " + std::to_string(total));
  const double env_steps = metric(after, "samples/env_steps") - metric(before, "samples/env_steps");
  CHECK(env_steps == total + 1, "env steps count the non-training episode's step too: " + std::to_string(env_steps) +
                                    " of " + std::to_string(total + 1));
}

/// The reply to a report is lost: the batch goes again under its batch_id and counts once.
void lost_reply(const Context& ctx) {
  rlserve::LocalOptions o;
  o.flush_interval = 1000;  // shipped at close
  auto client = connect(ctx, o);
  const auto before = metrics(ctx);
  const int total = play(*client, 31) + play(*client, 32);
  client->drop_next_report_reply();
  auto closed = client->close();
  CHECK(closed.ok(), "close: " + (closed ? "" : closed.error().message));
  CHECK(client->counts().duplicates == 1, "the re-sent batch is answered as a duplicate, got " +
                                              std::to_string(client->counts().duplicates));
  const double want = reported(before) + total;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return reported(m) >= want; });
  CHECK(reported(after) == want, "trained once: " + std::to_string(reported(after) - reported(before)) + " of " +
                                     std::to_string(total));
}

/// The learner trains on the shipped steps (train batch 256) and publishes newer weights,
/// which the refresher fetches; an unchanged version is never fetched again.
void refresh(const Context& ctx) {
  rlserve::LocalOptions o;
  o.fragment_length = 32;
  o.batch_steps = 64;
  o.flush_interval = 0.2;
  o.update_interval = 0.2;
  auto client = connect(ctx, o);
  const std::uint64_t first = client->weights_version();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  std::uint64_t seed = 100;
  int steps = 0;
  while (client->weights_version() < first + 2 && std::chrono::steady_clock::now() < deadline) {
    const int n = play(*client, seed++);
    if (n < 0 || steps > 200000) break;
    steps += n;
    client->flush(30);  // at the learner's pace: a report is answered when the learner took it
  }
  const std::uint64_t now = client->weights_version();
  std::printf("refresh: weights v%llu -> v%llu after %d steps\n", static_cast<unsigned long long>(first),
              static_cast<unsigned long long>(now), steps);
  CHECK(now >= first + 2, "newer weights in use: " + std::to_string(first) + " -> " + std::to_string(now));
  const auto c = client->counts();
  CHECK(c.weights_fetches >= 2 && c.weights_fetches <= 1 + (now - first),
        "one full fetch per new version, got " + std::to_string(c.weights_fetches) + " for versions " +
            std::to_string(first) + ".." + std::to_string(now));
  auto closed = client->close();
  CHECK(closed.ok(), "close: " + (closed ? "" : closed.error().message));
}

/// Steps taken before and while the server is down (killed with SIGKILL) reach the server
/// resumed on the same port, each once; a client with a small buffer drops its oldest batches
/// meanwhile, and says so.
void restart(Context& ctx) {
  rlserve::LocalOptions o;
  o.flush_interval = 1000;  // nothing ships on its own: every step below waits in the buffer
  o.batch_steps = 100000;
  o.update_interval = 0.5;
  auto client = connect(ctx, o);
  rlserve::LocalOptions small;  // a second client whose buffer holds 40 steps
  small.fragment_length = 10;
  small.batch_steps = 20;
  small.max_buffered_steps = 40;
  small.timeouts.reconnect = 1;  // its close() gives up at once
  auto bounded = connect(ctx, small);
  int total = play(*client, 51) + play(*client, 52);
  const int port = ctx.server->port();
  const std::string run = ctx.server->run_folder();
  ctx.server->kill9();
  ctx.server.reset();
  total += play(*client, 53) + play(*client, 54);  // acting goes on without the server
  for (std::uint64_t seed = 60; seed < 66; ++seed) play(*bounded, seed);
  const auto taken = bounded->counts().steps_taken;
  CHECK(bounded->counts().steps_dropped > 0 && bounded->buffered_steps() <= 40 + 20,
        "past max_buffered_steps the oldest batches go: " + std::to_string(bounded->counts().steps_dropped) + " dropped, " +
            std::to_string(bounded->buffered_steps()) + " kept");
  auto lossy = bounded->close();  // the server is down: what is left is lost, and close() says so
  CHECK(!lossy && lossy.error().code == rlserve::ErrorCode::timeout, "close times out while the server is down");
  if (!lossy) {
    CHECK(lossy.error().message.find("still buffered") != std::string::npos &&
              lossy.error().message.find("max_buffered_steps") != std::string::npos,
          "names what is buffered and what was dropped: " + lossy.error().message);
  }
  CHECK(bounded->counts().steps_shipped + bounded->counts().steps_dropped + bounded->buffered_steps() == taken,
        "every step shipped, dropped or still buffered");
  CHECK(client->buffered_steps() == static_cast<std::uint64_t>(total), "every step buffered: " +
                                                                          std::to_string(client->buffered_steps()));
  ctx.server = std::make_unique<e2e::ServerProcess>(
      ctx.bin_dir,
      std::vector<std::string>{"--resume", run, "--port", std::to_string(port), "--http-port", "0", "--no-progress",
                               "--ppo-device", "cpu"},
      std::vector<std::string>{std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/server-2.log");
  CHECK(ctx.server->port() == port, "resumed on the same port");
  const auto before = wait_metrics(ctx, [](const nlohmann::json& m) { return reported(m) >= 0; });
  auto closed = client->close();
  CHECK(closed.ok(), "close ships the buffered steps to the resumed server: " + (closed ? "" : closed.error().message));
  const double want = reported(before) + total;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return reported(m) >= want; });
  std::printf("restart: %d steps buffered across the kill; the resumed server: steps_reported %.0f, env_steps %.0f\n", total,
              reported(after), metric(after, "samples/env_steps"));
  CHECK(reported(after) == want, "no step lost or doubled: " + std::to_string(reported(after) - reported(before)) + " of " +
                                     std::to_string(total));
}

/// The C ABI's client with inference_mode "local": one episode, every step reaches the server.
void c_abi(const Context& ctx) {
  const auto before = metrics(ctx);
  rlserve_client* client = nullptr;
  rlserve_status st = rlserve_client_connect(ctx.server->address().c_str(), kToken, "local", nullptr, &client);
  CHECK(st == RLSERVE_OK, std::string("connect: ") + rlserve_last_error());
  if (st != RLSERVE_OK) return;
  char id[129];
  CHECK(rlserve_client_start_episode(client, nullptr, 1, id, sizeof id) == RLSERVE_OK, "start_episode");
  cartpole::CartPole env(71);
  auto obs = env.reset();
  int steps = 0;
  for (;;) {
    double action = -1;
    std::size_t n = 0;
    st = rlserve_client_get_action(client, id, obs.data(), obs.size(), &action, 1, &n);
    CHECK(st == RLSERVE_OK && n == 1 && (action == 0 || action == 1), std::string("get_action: ") + rlserve_last_error());
    if (st != RLSERVE_OK) break;
    auto step = env.step(static_cast<int>(action));
    ++steps;
    obs = step.observation;
    rlserve_client_log_returns(client, id, step.reward);
    if (step.terminated || step.truncated) {
      CHECK(rlserve_client_end_episode(client, id, obs.data(), obs.size(), step.truncated) == RLSERVE_OK, "end_episode");
      break;
    }
  }
  CHECK(rlserve_client_close(client) == RLSERVE_OK, std::string("close: ") + rlserve_last_error());
  const double want = reported(before) + steps;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return reported(m) >= want; });
  CHECK(reported(after) == want, "the C client's steps counted once");
}

/// The C ABI's calls from C with inference_mode "local" (tests/e2e/c_abi_episodes.c): a logged
/// action and info, batched calls, a multi-agent episode; every step reaches the server once.
void c_abi_calls(const Context& ctx) {
  const auto before = metrics(ctx);
  const auto [rc, text] = e2e::run_program(std::string("RLSERVE_TOKEN=") + kToken + " " + ctx.c_abi + " " +
                                               ctx.server->address() + " local", ctx.work + "/c_abi.out");
  const int steps = e2e::steps_printed(text);
  CHECK(rc == 0 && steps > 0, "c_abi_episodes: " + text);
  const double want = reported(before) + steps;
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return reported(m) >= want; });
  CHECK(reported(after) == want, "the C program's steps counted once: " + std::to_string(reported(after) - reported(before)) +
                                     " of " + std::to_string(steps));
}

/// A multi-agent episode computed here: a truncated agent's last step is dropped (one that acted
/// once adds nothing), a terminated one's is kept; every other step reaches the server once.
void multi_agent(const Context& ctx) {
  rlserve::LocalOptions o;
  o.flush_interval = 1000;
  o.fragment_length = 2;  // a's three steps span two fragments
  auto client = connect(ctx, o);
  const auto before = metrics(ctx);
  const std::vector<float> raw{0.01f, -0.02f, 0.03f, 0.04f};
  const rlserve::Value obs = *client->observation_value(raw);
  auto id = client->start_episode();
  auto first = client->get_agent_actions(*id, {{"a", obs}, {"b", obs}, {"c", obs}});
  CHECK(first.ok() && first->size() == 3, "three agents act: " + (first ? "" : first.error().message));
  CHECK(!client->get_action(*id, raw).ok(), "a multi-agent episode refuses single-agent calls");
  CHECK(client->log_agent_returns(*id, {{"a", 1.0}, {"b", 1.0}, {"c", 1.0}}, {{"c", false}}).ok(), "c truncated");
  CHECK(client->get_agent_actions(*id, {{"a", obs}, {"b", obs}}).ok(), "a and b act");
  CHECK(client->log_agent_returns(*id, {{"a", 1.0}, {"b", 1.0}}, {{"b", false}}).ok(), "b truncated");
  auto again = client->get_agent_actions(*id, {{"b", obs}});
  CHECK(!again && again.error().code == rlserve::ErrorCode::episode_error, "a done agent may not act");
  auto never = client->log_agent_returns(*id, {{"z", 1.0}});
  CHECK(!never && never.error().code == rlserve::ErrorCode::episode_error, "an agent that never acted is not rewarded");
  CHECK(client->get_agent_actions(*id, {{"a", obs}}).ok(), "a acts on");
  CHECK(client->log_agent_returns(*id, {{"a", 1.0}}).ok(), "a's reward");
  CHECK(client->end_agent_episode(*id, {}).ok(), "the episode ends; a terminates without a final observation");
  const std::uint64_t kept = 3 + 1 + 0;  // a: 3, b: 2 less its last, c: 1 less its last
  CHECK(client->counts().steps_taken == kept, "steps taken " + std::to_string(client->counts().steps_taken));
  auto closed = client->close();
  CHECK(closed.ok(), "close: " + (closed ? "" : closed.error().message));
  const double want = reported(before) + static_cast<double>(kept);
  const auto after = wait_metrics(ctx, [&](const nlohmann::json& m) { return reported(m) >= want; });
  CHECK(reported(after) == want, "the kept steps counted once: " + std::to_string(reported(after) - reported(before)));
  CHECK(metric(after, "episodes/completed") == metric(before, "episodes/completed") + 1, "one episode completed");
}

/// A Dict action space {gear: Discrete(3, start=1), lights: MultiBinary(2), steer: Box(1)}: the
/// actions computed here fit it, a logged one is taken (a bad one refused), every step ships.
void dict_actions(const Context& ctx) {
  const std::string spaces = ctx.work + "/dict_spaces.json";
  if (std::FILE* f = std::fopen(spaces.c_str(), "w")) {
    std::fputs(R"({"observation_space": {"type": "Box", "shape": [3], "dtype": "float32", "low": -1.0, "high": 1.0},
      "action_space": {"type": "Dict", "spaces": {"gear": {"type": "Discrete", "n": 3, "start": 1},
      "lights": {"type": "MultiBinary", "n": [2]},
      "steer": {"type": "Box", "shape": [1], "dtype": "float32", "low": -1.0, "high": 1.0}}}})", f);
    std::fclose(f);
  }
  e2e::ServerProcess server(ctx.bin_dir,
                            {"--spaces-file", spaces, "--run-dir", ctx.work, "--name", "dict", "--port", "0", "--http-port",
                             "0", "--no-progress", "--ppo-device", "cpu", "--seed", "1"},
                            {std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/dict.log");
  rlserve::LocalOptions o;
  o.token = kToken;
  o.timeouts.request = 30;
  o.flush_interval = 1000;
  o.seed = 3;
  auto client = rlserve::LocalClient::connect(server.address(), o);
  CHECK(client.ok(), "local inference for a Dict action space: " + (client ? "" : client.error().message));
  if (!client) return;
  const rlserve::Space space = (*client)->action_space();
  const double before = reported(e2e::metrics(server, kToken));
  using M = rlserve::Value::Map;
  float steer = 0.5f;
  rlserve::NDArray lights(rlserve::DType::int8, {2});
  lights.set_int64(0, 1);
  const rlserve::Value logged(M{{"gear", std::int64_t{2}},
                                {"lights", rlserve::Value(lights)},
                                {"steer", rlserve::Value(rlserve::NDArray::from_floats(&steer, {1}))}});
  int steps = 0;
  for (int episode = 0; episode < 2; ++episode) {
    auto id = (*client)->start_episode();
    for (int t = 0; t < 10; ++t) {
      const std::vector<float> obs{0.1f * static_cast<float>(t) - 0.5f, 0.2f, -0.3f};
      auto a = (*client)->get_action(*id, obs);
      CHECK(a.ok(), "get_action: " + (a ? "" : a.error().message));
      if (!a) return;
      std::vector<float> flat;
      CHECK(rlserve::flatten(space, a->value, flat, "action").ok(), "the action fits the Dict space");
      CHECK(a->values.size() == 4 && a->values[0] >= 1 && a->values[0] <= 3, "gear, two lights, steer; gear in 1..3");
      (*client)->log_returns(*id, 1.0);
      ++steps;
    }
    auto obs_value = (*client)->observation_value({0.0f, 0.1f, 0.2f});
    auto taken = (*client)->log_action(*id, *obs_value, logged);
    CHECK(taken.ok(), "a logged Dict action: " + (taken ? "" : taken.error().message));
    ++steps;
    rlserve::Value bad = logged;
    bad.as_map()->front().second = rlserve::Value(std::int64_t{7});
    auto refused = (*client)->log_action(*id, *obs_value, bad);
    CHECK(!refused && refused.error().code == rlserve::ErrorCode::bad_value, "gear 7 is refused");
    CHECK((*client)->end_episode(*id, std::vector<float>{0.0f, 0.0f, 0.0f}).ok(), "end");
  }
  auto closed = (*client)->close();
  CHECK(closed.ok(), "close: " + (closed ? "" : closed.error().message));
  const double want = before + steps;
  const auto after = e2e::wait_metrics(server, kToken, [&](const nlohmann::json& m) { return reported(m) >= want; }, 300);
  CHECK(reported(after) == want, "every step accepted once: " + std::to_string(reported(after) - before) + " of " +
                                     std::to_string(steps));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s <python bin dir> <c_abi_episodes>\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/rlserve-cpp-e2e-local-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 2;
  Context ctx{argv[1], argv[2], tmpl, nullptr};
  try {
    ctx.server = std::make_unique<e2e::ServerProcess>(
        ctx.bin_dir,
        std::vector<std::string>{"--spaces-from", "CartPole-v1", "--run-dir", ctx.work, "--name", "run", "--port", "0",
                                 "--http-port", "0", "--no-progress", "--ppo-device", "cpu", "--seed", "1",
                                 "--ppo-train-batch-size", "256", "--ppo-minibatch-size", "64", "--ppo-num-epochs", "1"},
        std::vector<std::string>{std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/server-1.log");
    e2e::run_cases({
        {"steps_counted", [&] { steps_counted(ctx); }},
        {"lost_reply", [&] { lost_reply(ctx); }},
        {"refresh", [&] { refresh(ctx); }},
        {"c_abi", [&] { c_abi(ctx); }},
        {"c_abi_calls", [&] { c_abi_calls(ctx); }},
        {"dict_actions", [&] { dict_actions(ctx); }},
        {"multi_agent", [&] { multi_agent(ctx); }},
        {"restart", [&] { restart(ctx); }},
    });
  } catch (const std::exception& e) {
    check::fail(__FILE__, __LINE__, e.what());
  }
  if (check::failures() != 0 && ctx.server) std::fprintf(stderr, "server log:\n%s\n", ctx.server->log().c_str());
  ctx.server.reset();  // killed, its whole process group
  if (check::failures() == 0) std::filesystem::remove_all(ctx.work);
  return check::finish("e2e_local");
}
