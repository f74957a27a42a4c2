// End to end against a real `rlserve serve` with a small frame limit (--max-frame-bytes 65536,
// CartPole-v1 spaces): a local client's buffered experience goes in several report_samples
// frames, each within the limit, every step once; a remote call over the limit is refused
// before it is sent, naming the limit, and the connection carries on; and closing (or
// destroying) a local client whose server hangs with a report waiting returns after the flush
// timeout, naming the steps left unshipped; and a pipelined start the server-wide episode
// limit refuses is returned by the next call. Its ctest TIMEOUT is the bound: a close() that waited
// for the request timeout (an hour here) would not return.
// Usage: test_e2e_limits <python bin dir>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "../check.hpp"
#include "rlserve/client.hpp"
#include "rlserve/local_client.hpp"
#include "harness.hpp"
#include "server_process.hpp"

namespace {

const char* kToken = "cpp-e2e-limits";
constexpr std::uint64_t kFrameLimit = 65536;

struct Context {
  std::string bin_dir, work;
  std::unique_ptr<e2e::ServerProcess> server;
};

double reported(const nlohmann::json& m) { return e2e::metric(m, "samples/steps_reported"); }

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::unique_ptr<rlserve::LocalClient> connect_local(const Context& ctx, rlserve::LocalOptions o) {
  o.token = kToken;
  o.client_name = "cpp-e2e-limits";
  o.seed = 5;
  auto c = rlserve::LocalClient::connect(ctx.server->address(), o);
  if (!c) throw std::runtime_error("connect failed: " + c.error().message);
  return std::move(*c);
}

/// About 4000 steps buffered (nothing ships before close) are several times the frame limit:
/// close() ships them in several batches the server takes (it closes a connection that sends
/// a frame over its limit, and the client refuses to send one), each step counted once.
void split_reports(const Context& ctx) {
  rlserve::LocalOptions o;
  o.flush_interval = 1000;
  o.batch_steps = 100000;
  o.timeouts.request = 30;
  auto client = connect_local(ctx, o);
  const auto before = e2e::metrics(*ctx.server, kToken);
  std::uint64_t total = 0;
  for (std::uint64_t seed = 1; total < 4000; ++seed) {
    const int n = e2e::play(*client, seed);
    if (n < 0) return;
    total += static_cast<std::uint64_t>(n);
  }
  CHECK(client->buffered_steps() == total && client->counts().batches_sent == 0, "everything waits for close()");
  auto closed = client->close();
  CHECK(closed.ok(), "close ships every step within the frame limit: " + (closed ? "" : closed.error().message));
  const auto c = client->counts();
  std::printf("split_reports: %llu steps in %llu report_samples frames of at most %llu bytes\n",
              static_cast<unsigned long long>(total), static_cast<unsigned long long>(c.batches_sent),
              static_cast<unsigned long long>(kFrameLimit));
  CHECK(c.steps_shipped == total && c.duplicates == 0, "shipped " + std::to_string(c.steps_shipped) + " of " + std::to_string(total));
  CHECK(c.batches_sent >= 3, "several frames (at least 40 bytes a step: 160 KB), got " + std::to_string(c.batches_sent));
  const double want = reported(before) + static_cast<double>(total);
  const auto after = e2e::wait_metrics(*ctx.server, kToken, [&](const nlohmann::json& m) { return reported(m) >= want; }, 300);
  CHECK(reported(after) == want, "the server counts every step once: " + std::to_string(reported(after) - reported(before)) +
                                     " of " + std::to_string(total));
}

/// A get_actions for 2000 episodes (about 130 KB) is over the limit: refused here with
/// frame_too_large naming the limit; the same episodes then step in calls that fit.
void remote_over_limit(const Context& ctx) {
  rlserve::ClientOptions o;
  o.token = kToken;
  o.timeouts.request = 30;
  auto c = rlserve::Client::connect(ctx.server->address(), o);
  CHECK(c.ok(), "connect: " + (c ? "" : c.error().message));
  if (!c) return;
  rlserve::Client& client = **c;
  const std::vector<float> raw{0.01f, -0.02f, 0.03f, 0.04f};
  const rlserve::Value obs(rlserve::NDArray::from_floats(raw.data(), {4}));
  std::vector<std::string> ids;
  for (int i = 0; i < 2000; ++i) {
    auto id = client.start_episode();
    if (!id) {
      CHECK(false, "start_episode: " + id.error().message);
      return;
    }
    ids.push_back(*id);
  }
  auto big = client.get_actions(ids, std::vector<rlserve::Value>(ids.size(), obs));
  CHECK(!big && big.error().code == rlserve::ErrorCode::frame_too_large, "a call over the frame limit is frame_too_large");
  if (!big) {
    CHECK(big.error().message.find("frame limit of " + std::to_string(kFrameLimit) + " bytes") != std::string::npos &&
              big.error().message.find("send less per call") != std::string::npos,
          "the message names the limit and the fix: " + big.error().message);
  }
  const std::vector<std::string> few(ids.begin(), ids.begin() + 8);
  auto small = client.get_actions(few, std::vector<rlserve::Value>(few.size(), obs));
  CHECK(small.ok() && small->size() == 8, "the same episodes step in a call that fits: " + (small ? "" : small.error().message));
  auto one = client.get_action(ids.back(), raw);
  CHECK(one.ok(), "and one by one: " + (one ? "" : one.error().message));
  CHECK(client.reconnects() == 0, "on the same connection");
  for (int k = 0; k < 2; ++k) {
    auto again = client.get_action(few[0], raw);
    CHECK(again.ok(), "the episode carries on: " + (again ? "" : again.error().message));
  }
  auto ended = client.end_episode(few[0], raw);
  CHECK(ended.ok() && client.close().ok(), "ends and closes");
}

/// A random id's start is pipelined; the server-wide episode limit (1 here, which the client
/// cannot see) refuses the second: the next call returns that error, naming the start, and the
/// episode never opened, while the first carries on.
void pipelined_start_refused(const Context& ctx) {
  e2e::ServerProcess server(ctx.bin_dir,
                            std::vector<std::string>{"--spaces-from", "CartPole-v1", "--run-dir", ctx.work, "--name", "one",
                                                     "--port", "0", "--http-port", "0", "--no-progress", "--ppo-device",
                                                     "cpu", "--seed", "1", "--max-episodes-per-server", "1"},
                            std::vector<std::string>{std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/one.log");
  rlserve::ClientOptions o;
  o.token = kToken;
  o.timeouts.request = 30;
  auto c = rlserve::Client::connect(server.address(), o);
  CHECK(c.ok(), "connect: " + (c ? "" : c.error().message));
  if (!c) return;
  rlserve::Client& client = **c;
  const std::vector<float> raw{0.01f, -0.02f, 0.03f, 0.04f};
  auto first = client.start_episode();
  auto refused = client.start_episode();  // pipelined: its refusal comes with the next call
  CHECK(first.ok() && refused.ok(), "both starts return at once");
  if (!first || !refused) return;
  auto a = client.get_action(*refused, raw);
  CHECK(!a && a.error().code == rlserve::ErrorCode::capacity, "the next call returns the start's capacity error");
  if (!a) {
    CHECK(a.error().message.find("start_episode of episode '" + *refused + "' failed") != std::string::npos,
          "naming the start: " + a.error().message);
  }
  auto again = client.get_action(*refused, raw);
  CHECK(!again && again.error().code == rlserve::ErrorCode::episode_error, "the refused episode never opened");
  auto ok = client.get_action(*first, raw);
  CHECK(ok.ok(), "the first episode carries on: " + (ok ? "" : ok.error().message));
  // A refusal read on the way to a reply that is then lost: the call, re-sent, returns its
  // answer (it may have been applied), and the next call returns the refusal, unsent.
  auto later = client.start_episode();
  CHECK(later.ok(), "a third start returns at once");
  client.drop_next_reply();
  auto resent = client.get_action(*first, raw);
  CHECK(resent.ok() && client.reconnects() == 1, "the re-sent call returns its answer: " + (resent ? "" : resent.error().message));
  auto kept = client.get_action(*first, raw);
  CHECK(!kept && kept.error().code == rlserve::ErrorCode::capacity, "the next call returns the kept refusal");
  auto after = client.get_action(*first, raw);
  CHECK(after.ok(), "and the one after carries on: " + (after ? "" : after.error().message));
  auto nope = client.start_episode("", true, "nope");  // a policy the welcome does not name waits
  CHECK(!nope && nope.error().code == rlserve::ErrorCode::episode_error, "an unknown policy is refused by start_episode");
  CHECK(client.end_episode(*first, raw).ok(), "ends");
  auto last = client.start_episode();
  auto over = client.start_episode();  // refused: close() reads its reply and returns the error
  CHECK(last.ok() && over.ok(), "two more starts return at once");
  auto closed = client.close();
  CHECK(!closed && closed.error().code == rlserve::ErrorCode::capacity, "close() returns a pipelined start's refusal");
}

/// The server hangs (SIGSTOP) while reports wait: close() gives up after its flush timeout
/// (the reconnect timeout, 1 s) instead of waiting for the reply (request timeout: an hour),
/// and names the steps it could not ship; a client destroyed unclosed returns as well.
/// Unconfirmed pipelined starts are re-sent to a restarted server in order; when it refuses one,
/// those behind it are not re-sent: their episodes are lost (saying why), not left open.
void refused_after_restart(const Context& ctx) {
  const std::vector<std::string> env{std::string("RLSERVE_TOKEN=") + kToken};
  auto args = [&](const std::string& name, const std::string& port) {
    return std::vector<std::string>{"--spaces-from", "CartPole-v1", "--run-dir", ctx.work, "--name", name, "--port", port,
                                    "--http-port", "0", "--no-progress", "--ppo-device", "cpu", "--seed", "1"};
  };
  auto first = std::make_unique<e2e::ServerProcess>(ctx.bin_dir, args("before", "0"), env, ctx.work + "/before.log");
  rlserve::ClientOptions o;
  o.token = kToken;
  o.timeouts.request = 30;
  o.timeouts.reconnect = 60;
  auto c = rlserve::Client::connect(first->address(), o);
  CHECK(c.ok(), "connect: " + (c ? "" : c.error().message));
  if (!c) return;
  rlserve::Client& client = **c;
  const std::vector<float> raw{0.01f, -0.02f, 0.03f, 0.04f};
  first->suspend();  // it reads nothing: no start below is answered
  auto kept = client.start_episode();
  auto refused = client.start_episode();
  auto behind = client.start_episode();
  CHECK(kept.ok() && refused.ok() && behind.ok(), "the starts return at once");
  if (!kept || !refused || !behind) return;
  const std::string port = std::to_string(first->port());
  first->kill9();
  first.reset();
  auto limited = args("after", port);
  limited.insert(limited.end(), {"--max-episodes-per-server", "1"});
  e2e::ServerProcess second(ctx.bin_dir, limited, env, ctx.work + "/after.log");
  auto a = client.get_action(*kept, raw);  // re-sends the three starts: the second is refused
  CHECK(!a && a.error().code == rlserve::ErrorCode::capacity, "the restarted server's capacity error");
  auto lost = client.get_action(*behind, raw);
  CHECK(!lost && lost.error().code == rlserve::ErrorCode::episode_lost, "the start behind it is lost");
  if (!lost) CHECK(lost.error().message.find("was not re-sent") != std::string::npos, lost.error().message);
  auto never = client.get_action(*refused, raw);
  CHECK(!never && never.error().code == rlserve::ErrorCode::episode_error, "the refused episode never opened");
  auto ok = client.get_action(*kept, raw);
  CHECK(ok.ok(), "the first episode runs on the new server: " + (ok ? "" : ok.error().message));
  CHECK(client.end_episode(*kept, raw).ok() && client.close().ok(), "end and close");
}

void close_hung_server(Context& ctx) {
  rlserve::LocalOptions o;
  o.flush_interval = 1000;
  o.timeouts.request = 3600;
  o.timeouts.reconnect = 1;
  o.update_interval = 0.2;  // its refresher is waiting on the hung server too
  auto closing = connect_local(ctx, o);
  rlserve::LocalOptions busy = o;
  busy.flush_interval = 0.05;
  busy.fragment_length = 8;
  auto dropped = connect_local(ctx, busy);
  std::uint64_t total = 0;
  for (std::uint64_t seed = 200; seed < 204; ++seed) total += static_cast<std::uint64_t>(e2e::play(*closing, seed));
  ctx.server->suspend();
  for (std::uint64_t seed = 300; seed < 304; ++seed) e2e::play(*dropped, seed);  // its shipper now waits for a reply
  CHECK(closing->buffered_steps() == total, "the steps wait");
  auto start = std::chrono::steady_clock::now();
  auto closed = closing->close();
  const double close_s = seconds_since(start);
  CHECK(!closed && closed.error().code == rlserve::ErrorCode::timeout, "close() with a hung server is a timeout");
  if (!closed) {
    CHECK(closed.error().message.find(std::to_string(total) + " steps are still buffered") != std::string::npos,
          "naming the steps left: " + closed.error().message);
  }
  CHECK(closing->counts().steps_shipped == 0, "none shipped");
  start = std::chrono::steady_clock::now();
  dropped.reset();
  const double destroy_s = seconds_since(start);
  std::printf("close_hung_server: close() returned after %.2f s (%llu steps unshipped), the destructor after %.2f s\n", close_s,
              static_cast<unsigned long long>(total), destroy_s);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <python bin dir>\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/rlserve-cpp-e2e-limits-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 2;
  Context ctx{argv[1], tmpl, nullptr};
  try {
    ctx.server = std::make_unique<e2e::ServerProcess>(
        ctx.bin_dir,
        std::vector<std::string>{"--spaces-from", "CartPole-v1", "--run-dir", ctx.work, "--name", "run", "--port", "0",
                                 "--http-port", "0", "--no-progress", "--ppo-device", "cpu", "--seed", "1",
                                 "--max-frame-bytes", std::to_string(kFrameLimit)},
        std::vector<std::string>{std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/server.log");
    e2e::run_cases({
        {"split_reports", [&] { split_reports(ctx); }},
        {"remote_over_limit", [&] { remote_over_limit(ctx); }},
        {"pipelined_start_refused", [&] { pipelined_start_refused(ctx); }},
        {"refused_after_restart", [&] { refused_after_restart(ctx); }},
        {"close_hung_server", [&] { close_hung_server(ctx); }},
    });
  } catch (const std::exception& e) {
    check::fail(__FILE__, __LINE__, e.what());
  }
  if (check::failures() != 0 && ctx.server) std::fprintf(stderr, "server log:\n%s\n", ctx.server->log().c_str());
  ctx.server.reset();  // killed, its whole process group (stopped or not)
  if (check::failures() == 0) std::filesystem::remove_all(ctx.work);
  return check::finish("e2e_limits");
}
