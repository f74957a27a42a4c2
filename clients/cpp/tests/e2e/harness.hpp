// What the end-to-end tests share: the server's metrics read over HTTP, and one CartPole
// episode played through either client (`rlserve::Client`, remote, or `rlserve::LocalClient`:
// both have the same episode calls).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "../../examples/cartpole.hpp"
#include "../check.hpp"
#include "server_process.hpp"

namespace e2e {

/// The server's `/v1/metrics` (an empty object when it cannot be read).
inline nlohmann::json metrics(const ServerProcess& server, const std::string& token) {
  const std::string body = http_get(server.port(), "/v1/metrics", token);
  if (body.empty()) return nlohmann::json::object();
  return nlohmann::json::parse(body, nullptr, false);
}

/// One numeric metric; -1 when it is missing or not a number.
inline double metric(const nlohmann::json& m, const char* name) {
  return m.is_object() && m.contains(name) && m[name].is_number() ? m[name].get<double>() : -1.0;
}

/// Polls the metrics every 0.1 s until `ready` holds (`polls` times at most); the last read.
inline nlohmann::json wait_metrics(const ServerProcess& server, const std::string& token,
                                   const std::function<bool(const nlohmann::json&)>& ready,
                                   int polls) {
  nlohmann::json m;
  for (int i = 0; i < polls; ++i) {
    m = metrics(server, token);
    if (ready(m)) return m;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return m;
}

inline std::vector<float> vec(const std::array<float, 4>& a) { return {a.begin(), a.end()}; }

/// Plays one CartPole episode through `client`; its length (-1 on an error, recorded).
template <class Client>
int play(Client& client, std::uint64_t seed) {
  cartpole::CartPole env(seed);
  auto obs = env.reset();
  auto id = client.start_episode();
  CHECK(id.ok(), "start_episode: " + (id ? std::string() : id.error().message));
  if (!id) return -1;
  for (int steps = 1;; ++steps) {
    auto a = client.get_action(*id, vec(obs));
    CHECK(a.ok(), "get_action: " + (a ? std::string() : a.error().message));
    if (!a) return -1;
    CHECK(a->discrete() == 0 || a->discrete() == 1, "a Discrete(2) action");
    auto step = env.step(static_cast<int>(a->discrete()));
    obs = step.observation;
    CHECK(client.log_returns(*id, step.reward).ok(), "log_returns");
    if (step.terminated || step.truncated) {
      auto s = client.end_episode(*id, vec(obs), step.truncated);
      CHECK(s.ok(), "end_episode: " + (s ? std::string() : s.error().message));
      return steps;
    }
  }
}

/// Runs each named case in order, printing whether it passed and how long it took.
inline void run_cases(const std::vector<std::pair<const char*, std::function<void()>>>& cases) {
  for (const auto& [name, run] : cases) {
    const int failures = check::failures();
    const auto start = std::chrono::steady_clock::now();
    run();
    std::printf("%s: %s (%.1f s)\n", name, check::failures() == failures ? "ok" : "FAILED",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    std::fflush(stdout);
  }
}

}  // namespace e2e

namespace e2e {

/// Runs `command` through the shell with its output in `out_path`: the exit status and the output.
inline std::pair<int, std::string> run_program(const std::string& command, const std::string& out_path) {
  const int rc = std::system((command + " > " + out_path + " 2>&1").c_str());
  std::FILE* f = std::fopen(out_path.c_str(), "rb");
  std::string text;
  if (f != nullptr) {
    char buffer[4096];
    for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;) text.append(buffer, n);
    std::fclose(f);
  }
  return {rc, text};
}

/// The N of a "steps: N" line in a program's output; -1 without one.
inline int steps_printed(const std::string& text) {
  const auto at = text.find("steps: ");
  return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + 7);
}

}  // namespace e2e
