// cartpole_train: trains a policy on the C++ CartPole (examples/cartpole.hpp) through a running
// `rlserve serve` until the mean return of the last 100 episodes reaches 475; exits 1 when the
// step or time budget runs out first. Several threads each step their own CartPole through their
// own client, as several simulator instances would.
//
// Usage: [RLSERVE_TOKEN=...] cartpole_train [--local] [--clients N] [--max-env-steps N]
//            [--time-limit S] [--target R] [--seed S] [--max-unanswered-steps N] [host:port]
// Remote inference (the default: the server chooses every action) or --local (each client acts
// with the policy's weights and ships its steps in batches). `make demo-cpp` starts a server with
// the settings that solve it quickly (scripts/demo_cpp.py) and runs both modes.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cartpole.hpp"
#include "rlserve/client.hpp"
#include "rlserve/local_client.hpp"

namespace {

struct Options {
  std::string address = "127.0.0.1:9900";
  bool local = false;
  int clients = 4;
  std::uint64_t max_env_steps = 300000;
  double time_limit = 300;
  double target = 475;
  std::size_t window = 100;
  std::uint64_t seed = 0;
  // Local mode: a client waits while this many of its steps are unanswered, so that it runs at
  // most about a batch ahead of the learner instead of collecting steps it could not use.
  std::uint64_t max_unanswered_steps = 512;
};

using Clock = std::chrono::steady_clock;

/// What the threads share: the returns of the last `window` episodes and the counts.
class Progress {
 public:
  explicit Progress(const Options& o) : options_(o), started_(Clock::now()) {}

  /// Records a finished episode; once the target is reached, everyone stops.
  void episode_done(double episode_return) {
    std::lock_guard<std::mutex> lock(mutex_);
    returns_.push_back(episode_return);
    sum_ += episode_return;
    if (returns_.size() > options_.window) sum_ -= returns_.front(), returns_.pop_front();
    ++episodes_;
    if (!solved_ && returns_.size() == options_.window && sum_ / static_cast<double>(options_.window) >= options_.target) {
      solved_ = true;
      solved_steps_ = steps_.load();
      solved_seconds_ = seconds();
      stop_ = true;
    }
  }
  void step() { ++steps_; }
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_.empty()) error_ = what;
    stop_ = true;
  }
  bool stopping() const { return stop_; }
  void stop() { stop_ = true; }

  std::uint64_t steps() const { return steps_; }
  double seconds() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  /// "episodes E, env steps S, mean return (last W) M".
  std::string line() {
    std::lock_guard<std::mutex> lock(mutex_);
    char buf[160];
    std::snprintf(buf, sizeof buf, "episodes %llu, env steps %llu, mean return (last %zu) %.1f, %.1f s",
                  static_cast<unsigned long long>(episodes_), static_cast<unsigned long long>(steps_.load()),
                  returns_.size(), returns_.empty() ? 0.0 : sum_ / static_cast<double>(returns_.size()), seconds());
    return buf;
  }
  bool solved() const { return solved_; }
  std::uint64_t solved_steps() const { return solved_steps_; }
  double solved_seconds() const { return solved_seconds_; }
  std::string error() {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

 private:
  const Options& options_;
  const Clock::time_point started_;
  std::mutex mutex_;
  std::deque<double> returns_;
  double sum_ = 0;
  std::uint64_t episodes_ = 0;
  std::atomic<std::uint64_t> steps_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> solved_{false};
  std::uint64_t solved_steps_ = 0;
  double solved_seconds_ = 0;
  std::string error_;
};

/// Steps one CartPole through `client` (a Client or a LocalClient: the same episode calls)
/// until `progress` says stop. `pace` runs before each step.
template <class Client, class Pace>
void play(Client& client, std::uint64_t seed, Progress& progress, Pace pace) {
  cartpole::CartPole env(seed);
  while (!progress.stopping()) {
    auto obs = env.reset();
    auto episode = client.start_episode();
    if (!episode) return progress.fail("start_episode: " + episode.error().message);
    double total = 0;
    for (;;) {
      pace();
      auto action = client.get_action(*episode, std::vector<float>(obs.begin(), obs.end()));
      if (!action) return progress.fail("get_action: " + action.error().message);
      const auto step = env.step(static_cast<int>(action->discrete()));
      obs = step.observation;
      total += step.reward;
      progress.step();
      if (auto s = client.log_returns(*episode, step.reward); !s) return progress.fail("log_returns: " + s.error().message);
      const bool stopping = progress.stopping();
      if (step.terminated || step.truncated || stopping) {
        // An episode cut short by the stop is truncated: it did not end, its last value counts.
        auto s = client.end_episode(*episode, std::vector<float>(obs.begin(), obs.end()), step.truncated || !step.terminated);
        if (!s) return progress.fail("end_episode: " + s.error().message);
        if (!stopping) progress.episode_done(total);
        break;
      }
    }
  }
}

void remote_worker(const Options& o, int index, Progress& progress) {
  rlserve::ClientOptions options;
  if (const char* token = std::getenv("RLSERVE_TOKEN")) options.token = token;
  options.client_name = "cartpole-cpp-" + std::to_string(index);
  auto client = rlserve::Client::connect(o.address, options);
  if (!client) return progress.fail("connect: " + client.error().message);
  play(**client, o.seed * 1000 + index, progress, [] {});
  if (auto s = (*client)->close(); !s) progress.fail("close: " + s.error().message);
}

void local_worker(const Options& o, int index, Progress& progress) {
  rlserve::LocalOptions options;
  if (const char* token = std::getenv("RLSERVE_TOKEN")) options.token = token;
  options.client_name = "cartpole-cpp-local-" + std::to_string(index);
  options.batch_steps = 256;
  options.flush_interval = 0.5;
  options.seed = o.seed * 1000 + index + 1;
  auto client = rlserve::LocalClient::connect(o.address, options);
  if (!client) return progress.fail("connect: " + client.error().message);
  rlserve::LocalClient& c = **client;
  play(c, o.seed * 1000 + index, progress, [&] {
    while (c.buffered_steps() >= o.max_unanswered_steps && !progress.stopping())
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  if (auto s = c.close(); !s) progress.fail("close: " + s.error().message);
}

/// Reads the command line into `o`; false when it is not understood.
bool parse(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--local" || arg == "--remote") {
      o.local = arg == "--local";
      continue;
    }
    if (arg.rfind("--", 0) != 0) {
      o.address = arg;
      continue;
    }
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (arg == "--clients") o.clients = std::atoi(v);
    else if (arg == "--max-env-steps") o.max_env_steps = std::strtoull(v, nullptr, 10);
    else if (arg == "--time-limit") o.time_limit = std::atof(v);
    else if (arg == "--target") o.target = std::atof(v);
    else if (arg == "--seed") o.seed = std::strtoull(v, nullptr, 10);
    else if (arg == "--max-unanswered-steps") o.max_unanswered_steps = std::strtoull(v, nullptr, 10);
    else return false;
  }
  return o.clients > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: %s [--local] [--clients N] [--max-env-steps N] [--time-limit S] [--target R] "
                 "[--seed S] [--max-unanswered-steps N] [host:port]\n",
                 argv[0]);
    return 2;
  }
  const char* mode = o.local ? "local" : "remote";
  std::printf("training CartPole through %s: %d clients, %s inference, target %.0f over %zu episodes\n",
              o.address.c_str(), o.clients, mode, o.target, o.window);
  std::fflush(stdout);
  Progress progress(o);
  std::vector<std::thread> threads;
  for (int i = 0; i < o.clients; ++i)
    threads.emplace_back(o.local ? local_worker : remote_worker, std::cref(o), i, std::ref(progress));
  auto next_report = Clock::now();
  std::string budget;
  while (!progress.stopping()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (Clock::now() >= next_report) {
      std::printf("%s\n", progress.line().c_str());
      std::fflush(stdout);
      next_report += std::chrono::seconds(1);
    }
    if (progress.steps() >= o.max_env_steps) budget = "the step budget ran out (raise --max-env-steps)";
    else if (progress.seconds() >= o.time_limit) budget = "the time limit ran out (raise --time-limit)";
    if (!budget.empty()) progress.stop();
  }
  for (auto& t : threads) t.join();
  std::printf("%s\n", progress.line().c_str());
  if (const std::string error = progress.error(); !error.empty()) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
    return 1;
  }
  if (!progress.solved()) {
    std::printf("NOT solved: %s at env_steps=%llu, inference=%s\n", budget.c_str(),
                static_cast<unsigned long long>(progress.steps()), mode);
    return 1;
  }
  std::printf("solved: env_steps=%llu wall_seconds=%.1f inference=%s clients=%d\n",
              static_cast<unsigned long long>(progress.solved_steps()), progress.solved_seconds(), mode, o.clients);
  return 0;
}
