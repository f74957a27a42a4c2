// bench_client: the C++ side of bench/cpp_client.py (issue 25's figures).
//
//   bench_client remote <host:port> <seed> idle|train   one rlserve::Client stepping a CartPole
//   bench_client local  <host:port> <seed> idle|train   one rlserve::LocalClient stepping a CartPole
//   bench_client forward <host:port> <passes>           the served policy's forward pass per step
//
// remote and local connect, print "ready", then read one line "go <start> <window> <windows>"
// from stdin: <start> in seconds of CLOCK_MONOTONIC (Python's time.monotonic()), so that every
// client process of a scenario counts its steps in the same windows. They run the loop of
// bench/remote_inference.py (start_episode / get_action / CartPole step / log_returns /
// end_episode) until the last window closes and print one JSON line: steps and get_action
// latency percentiles (ms) per window. forward fetches the policy's weights and prints the
// median microseconds per step of Policy::compute_action (forward pass and sampling) and of
// Model::forward alone, over 5 runs of <passes> steps on observations of a CartPole rollout.
#include <time.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../examples/cartpole.hpp"
#include "rlserve/client.hpp"
#include "rlserve/connection.hpp"
#include "rlserve/local_client.hpp"
#include "rlserve/policy.hpp"
#include "rlserve/random.hpp"
#include "rlserve/requests.hpp"
#include "rlserve/transport.hpp"

namespace {

double monotonic_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "bench_client: %s\n", what.c_str());
  std::exit(1);
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto low = static_cast<std::size_t>(at);
  const std::size_t high = std::min(low + 1, values.size() - 1);
  return values[low] + (values[high] - values[low]) * (at - static_cast<double>(low));
}

std::vector<float> vec(const std::array<float, 4>& a) { return {a.begin(), a.end()}; }

/// The measurement windows: [start + k*window, start + (k+1)*window) for k < windows.
struct Windows {
  double start = 0, window = 1;
  int count = 0;
  double stop() const { return start + window * count; }
  int index(double now) const { return now < start ? -1 : static_cast<int>((now - start) / window); }
};

Windows wait_for_go() {
  std::printf("ready\n");
  std::fflush(stdout);
  std::string word;
  Windows w;
  if (!(std::cin >> word >> w.start >> w.window >> w.count) || word != "go") fail("expected 'go <start> <window> <windows>' on stdin");
  return w;
}

/// The benchmark's client loop on one CartPole; per-window steps and get_action latencies.
template <class Client>
void run_loop(Client& client, std::uint64_t seed, bool training, const Windows& w) {
  cartpole::CartPole env(seed);
  auto obs = env.reset();
  std::vector<long> steps(static_cast<std::size_t>(w.count), 0);
  std::vector<std::vector<double>> latencies(static_cast<std::size_t>(w.count));
  for (auto& l : latencies) l.reserve(200000);
  double now = monotonic_s();
  while (now < w.stop()) {
    auto id = client.start_episode("", training);
    if (!id) fail("start_episode: " + id.error().message);
    bool done = false;
    while (!done) {
      const double started = monotonic_s();
      auto action = client.get_action(*id, vec(obs));
      const double elapsed = monotonic_s() - started;
      if (!action) fail("get_action: " + action.error().message);
      auto step = env.step(static_cast<int>(action->discrete()));
      obs = step.observation;
      if (auto s = client.log_returns(*id, step.reward); !s) fail("log_returns: " + s.error().message);
      done = step.terminated || step.truncated;
      if (done) {
        if (auto s = client.end_episode(*id, vec(obs), step.truncated && !step.terminated); !s) {
          fail("end_episode: " + s.error().message);
        }
      }
      now = monotonic_s();
      const int k = w.index(now);
      if (k >= 0 && k < w.count) {
        ++steps[static_cast<std::size_t>(k)];
        latencies[static_cast<std::size_t>(k)].push_back(elapsed * 1e3);
      }
      if (now >= w.stop()) break;
    }
    if (done) obs = env.reset();
  }
  std::string json = "{\"steps\": [";
  for (std::size_t k = 0; k < steps.size(); ++k) json += (k ? ", " : "") + std::to_string(steps[k]);
  for (const auto& [name, q] : {std::pair<const char*, double>{"p50_ms", 0.5}, {"p99_ms", 0.99}}) {
    json += std::string("], \"") + name + "\": [";
    for (std::size_t k = 0; k < latencies.size(); ++k) {
      json += (k ? ", " : "") + std::to_string(percentile(latencies[k], q));
    }
  }
  std::printf("%s]}\n", json.c_str());
  std::fflush(stdout);
}

int remote(const std::string& address, std::uint64_t seed, bool training) {
  rlserve::ClientOptions options;
  options.client_name = "bench-cpp-" + std::to_string(seed);
  auto client = rlserve::Client::connect(address, options);
  if (!client) fail("connect: " + client.error().message);
  const Windows w = wait_for_go();
  run_loop(**client, seed, training, w);
  if (auto s = (*client)->close(); !s) fail("close: " + s.error().message);
  return 0;
}

int local(const std::string& address, std::uint64_t seed, bool training) {
  rlserve::LocalOptions options;
  options.client_name = "bench-cpp-local-" + std::to_string(seed);
  options.seed = seed + 1;
  auto client = rlserve::LocalClient::connect(address, options);
  if (!client) fail("connect: " + client.error().message);
  const Windows w = wait_for_go();
  run_loop(**client, seed, training, w);
  (*client)->close();  // steps left unshipped at the end are no error for the figure
  return 0;
}

/// The policy from a get_weights reply, asked again while the learner has no weights yet.
rlserve::Policy fetch_policy(const std::string& address) {
  auto parsed = rlserve::parse_address(address);
  if (!parsed) fail("address: " + parsed.error().message);
  rlserve::ConnectionOptions options;
  options.client_name = "bench-cpp-forward";
  options.inference_mode = "local";
  rlserve::Connection conn(*parsed, options);
  if (auto welcome = conn.open(); !welcome) fail("connect: " + welcome.error().message);
  for (int attempt = 0;; ++attempt) {
    auto reply = conn.request(rlserve::get_weights_request(0));
    if (reply) {
      auto policy = rlserve::Policy::from_weights(*reply);
      if (!policy) fail("weights: " + policy.error().message);
      conn.close();
      return std::move(policy).value();
    }
    if (attempt >= 300) fail("get_weights: " + reply.error().message);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

int forward(const std::string& address, long passes) {
  const rlserve::Policy policy = fetch_policy(address);
  const rlserve::Model& model = policy.model();
  if (model.obs_dim() != 4) fail("expected a CartPole policy (4 observation values)");
  // Observations of a CartPole rollout (random actions, reset when an episode ends).
  cartpole::CartPole env(7);
  std::vector<std::array<float, 4>> observations{env.reset()};
  std::mt19937_64 coin(7);
  while (observations.size() < 1024) {
    auto step = env.step(static_cast<int>(coin() & 1));
    observations.push_back(step.terminated || step.truncated ? env.reset() : step.observation);
  }
  rlserve::Rng rng(11);
  std::vector<float> y;
  std::vector<std::uint8_t> legal;
  double sink = 0;
  std::vector<double> act_us, forward_us;
  for (int run = 0; run < 5; ++run) {
    double started = monotonic_s();
    for (long i = 0; i < passes; ++i) {
      auto action = policy.compute_action(observations[static_cast<std::size_t>(i) & 1023].data(), nullptr, true, rng);
      if (!action) fail("compute_action: " + action.error().message);
      sink += action->logp;
    }
    act_us.push_back((monotonic_s() - started) * 1e6 / static_cast<double>(passes));
    started = monotonic_s();
    for (long i = 0; i < passes; ++i) {
      model.forward(observations[static_cast<std::size_t>(i) & 1023].data(), nullptr, nullptr, y, legal);
      sink += y[0];
    }
    forward_us.push_back((monotonic_s() - started) * 1e6 / static_cast<double>(passes));
  }
  std::printf("{\"compute_action_us\": %.4f, \"forward_us\": %.4f, \"version\": %llu, \"sink\": %g}\n",
              percentile(act_us, 0.5), percentile(forward_us, 0.5),
              static_cast<unsigned long long>(policy.version()), sink);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string usage =
      "usage: bench_client remote|local <host:port> <seed> idle|train  |  bench_client forward <host:port> <passes>";
  if (argc < 4) fail(usage);
  const std::string mode = argv[1], address = argv[2];
  if (mode == "forward") return forward(address, std::atol(argv[3]));
  if (argc < 5) fail(usage);
  const auto seed = static_cast<std::uint64_t>(std::atoll(argv[3]));
  const bool training = std::string(argv[4]) == "train";
  if (mode == "remote") return remote(address, seed, training);
  if (mode == "local") return local(address, seed, training);
  fail(usage);
}
