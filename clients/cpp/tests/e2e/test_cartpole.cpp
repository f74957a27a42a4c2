// End to end: the C++ CartPole example (examples/cartpole_train.cpp) trains to a mean return of
// 475 over its last 100 episodes through a real `rlserve serve` (the settings of
// examples/cartpole_server.toml, 127.0.0.1, port 0), with remote inference and then with local
// inference, each against a fresh server (a trained policy would make the second run trivial),
// within a step budget; past a budget it exits 1.
// Usage: test_e2e_cartpole <python bin dir> <cartpole_train> <cartpole_server.toml>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "../check.hpp"
#include "harness.hpp"
#include "server_process.hpp"

namespace {

const char* kToken = "cpp-e2e-cartpole";
// The step budget per mode: the demo's settings solve in ~70-145k env steps (docs/benchmarks.md
// "C++ CartPole"); the program exits 1 past it.
const char* kMaxEnvSteps = "250000";
const char* kTimeLimit = "150";

struct Context {
  std::string bin_dir, program, config, work;
};

/// Runs cartpole_train against `server` with `flags`; its exit status and output.
std::pair<int, std::string> run(const Context& ctx, const e2e::ServerProcess& server, const std::string& name,
                                const std::string& flags) {
  const std::string out = ctx.work + "/" + name + ".out";
  const std::string command = std::string("RLSERVE_TOKEN=") + kToken + " " + ctx.program + " " + server.address() +
                              " --clients 4 --seed 1 " + flags + " > " + out + " 2>&1";
  const int rc = std::system(command.c_str());
  std::ifstream in(out);
  return {rc, std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>())};
}

/// Trains through a fresh server in `mode` ("remote" or "local") until the target; then (the
/// policy trained) a budget too small for 100 episodes makes the program exit 1 saying so.
void solve(const Context& ctx, const std::string& mode) {
  e2e::ServerProcess server(ctx.bin_dir,
                            {"--config", ctx.config, "--run-dir", ctx.work, "--name", mode, "--port", "0",
                             "--http-port", "0", "--no-progress", "--ppo-device", "cpu", "--seed", "1"},
                            {std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/server-" + mode + ".log");
  const std::string flag = mode == "local" ? " --local" : "";
  const auto [rc, text] = run(ctx, server, mode, std::string("--max-env-steps ") + kMaxEnvSteps + " --time-limit " +
                                                      kTimeLimit + flag);
  std::smatch solved;
  const bool ok = rc == 0 && std::regex_search(text, solved, std::regex("solved: env_steps=\\d+ wall_seconds=[0-9.]+ inference=" + mode));
  CHECK(ok, mode + ": cartpole_train did not reach 475 (exit status " + std::to_string(rc) + "):\n" + text +
                "\nserver log:\n" + server.log());
  if (ok) std::printf("%s: %s\n", mode.c_str(), solved.str().c_str());
  const auto [short_rc, short_text] = run(ctx, server, mode + "-budget", "--max-env-steps 1000" + flag);
  CHECK(short_rc != 0 && short_text.find("NOT solved: the step budget ran out (raise --max-env-steps)") != std::string::npos,
        mode + ": past its step budget cartpole_train exits 1 saying so (exit status " + std::to_string(short_rc) +
            "):\n" + short_text);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s <python bin dir> <cartpole_train> <cartpole_server.toml>\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/rlserve-cpp-e2e-cartpole-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 2;
  const Context ctx{argv[1], argv[2], argv[3], tmpl};
  try {
    e2e::run_cases({
        {"remote", [&] { solve(ctx, "remote"); }},
        {"local", [&] { solve(ctx, "local"); }},
    });
  } catch (const std::exception& e) {
    check::fail(__FILE__, __LINE__, e.what());
  }
  if (check::failures() == 0) std::filesystem::remove_all(ctx.work);
  return check::finish("e2e_cartpole");
}
