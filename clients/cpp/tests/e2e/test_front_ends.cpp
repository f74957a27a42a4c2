// End to end with several serving front-ends (each a real `rlserve serve` on 127.0.0.1, port 0,
// with its own run folder), given to the client comma-separated: the first that answers is used
// (also through the C ABI); when it is killed with SIGKILL a remote-inference client's open
// episode is lost and new ones run on another; a local-inference client delivers every step it
// had not shipped to another, once; a front-end of another run is refused by name.
// Usage: test_e2e_front_ends <python bin dir>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "../check.hpp"
#include "harness.hpp"
#include "rlserve.h"
#include "rlserve/client.hpp"
#include "rlserve/local_client.hpp"
#include "server_process.hpp"

namespace {

const char* kToken = "cpp-e2e-front-ends";

struct Context {
  std::string bin_dir, work;
  int started = 0;
};

std::unique_ptr<e2e::ServerProcess> launch(Context& ctx, const char* spaces = "CartPole-v1") {
  const std::string name = "run" + std::to_string(++ctx.started);
  return std::make_unique<e2e::ServerProcess>(
      ctx.bin_dir,
      std::vector<std::string>{"--spaces-from", spaces, "--run-dir", ctx.work, "--name", name, "--port", "0", "--http-port",
                               "0", "--no-progress", "--ppo-device", "cpu", "--seed", "1"},
      std::vector<std::string>{std::string("RLSERVE_TOKEN=") + kToken}, ctx.work + "/" + name + ".log");
}

/// A loopback address nothing listens on (bound, then closed).
std::string refusing_address() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

rlserve::ClientOptions options() {
  rlserve::ClientOptions o;
  o.token = kToken;
  o.timeouts.request = 30;
  o.timeouts.reconnect = 60;
  return o;
}

double completed(const e2e::ServerProcess& server) {
  return e2e::metric(e2e::metrics(server, kToken), "episodes/completed");
}

void first_that_answers(const e2e::ServerProcess& a, const e2e::ServerProcess& b) {
  auto both = rlserve::Client::connect(a.address() + ", " + b.address(), options());
  CHECK(both.ok() && (*both)->front_end() == a.address(), "the first front-end in the list");
  auto skipping = rlserve::Client::connect(refusing_address() + "," + b.address() + "," + a.address(), options());
  CHECK(skipping.ok() && (*skipping)->front_end() == b.address(), "a refusing front-end is skipped, in order");
  if (skipping) CHECK(e2e::play(**skipping, 1) > 0 && (*skipping)->close().ok(), "an episode on it");
  auto bad = rlserve::Client::connect(a.address() + ",,", options());
  CHECK(!bad && bad.error().code == rlserve::ErrorCode::invalid_argument &&
            bad.error().message.find("empty entry") != std::string::npos,
        "an empty entry is refused");
  // The C ABI takes the same list.
  rlserve_client* client = nullptr;
  const std::string list = refusing_address() + "," + b.address();
  rlserve_status st = rlserve_client_connect(list.c_str(), kToken, "remote", nullptr, &client);
  CHECK(st == RLSERVE_OK, std::string("C connect to a list: ") + rlserve_last_error());
  char id[129];
  float obs[4] = {0.01f, 0.0f, 0.02f, 0.0f};
  double action = -1;
  std::size_t n = 0;
  CHECK(st == RLSERVE_OK && rlserve_client_start_episode(client, nullptr, 1, id, sizeof id) == RLSERVE_OK &&
            rlserve_client_get_action(client, id, obs, 4, &action, 1, &n) == RLSERVE_OK &&
            rlserve_client_end_episode(client, id, obs, 4, 1) == RLSERVE_OK,
        std::string("an episode through the C ABI: ") + rlserve_last_error());
  CHECK(rlserve_client_close(client) == RLSERVE_OK, "close");
  const auto m = e2e::wait_metrics(b, kToken, [](const nlohmann::json& j) { return e2e::metric(j, "episodes/completed") >= 2; }, 200);
  CHECK(e2e::metric(m, "episodes/completed") == 2, "both episodes ran on the second front-end");
}

void remote_moves(std::unique_ptr<e2e::ServerProcess>& a, const e2e::ServerProcess& b) {
  auto client = rlserve::Client::connect(a->address() + "," + b.address(), options());
  CHECK(client.ok(), "connect");
  if (!client) return;
  const double before = completed(b);
  const std::vector<float> obs{0.01f, -0.02f, 0.03f, 0.04f};
  auto old = (*client)->start_episode();
  CHECK(old.ok() && (*client)->get_action(*old, obs).ok(), "an episode on the first front-end");
  a->kill9();
  a.reset();
  auto lost = (*client)->get_action(*old, obs);
  CHECK(!lost && lost.error().code == rlserve::ErrorCode::episode_lost, "the open episode is lost");
  CHECK((*client)->front_end() == b.address(), "moved to the second front-end");
  CHECK(e2e::play(**client, 3) > 0, "a new episode runs there");
  CHECK((*client)->close().ok(), "close");
  const auto m = e2e::wait_metrics(b, kToken, [&](const nlohmann::json& j) { return e2e::metric(j, "episodes/completed") >= before + 1; }, 200);
  CHECK(e2e::metric(m, "episodes/completed") == before + 1, "the new episode completed on the second front-end");
}

void local_moves(std::unique_ptr<e2e::ServerProcess>& c, const e2e::ServerProcess& b) {
  rlserve::LocalOptions o;
  o.token = kToken;
  o.timeouts.request = 30;
  o.timeouts.reconnect = 60;
  o.flush_interval = 1000;  // nothing ships before close(): every step is unacknowledged at the kill
  o.update_interval = 0;
  o.seed = 5;
  auto client = rlserve::LocalClient::connect(c->address() + "," + b.address(), o);
  CHECK(client.ok(), "local connect: " + (client ? "" : client.error().message));
  if (!client) return;
  const double before = e2e::metric(e2e::metrics(b, kToken), "samples/steps_reported");
  const int total = e2e::play(**client, 41) + e2e::play(**client, 42);
  c->kill9();
  c.reset();
  auto closed = (*client)->close();
  CHECK(closed.ok(), "close ships to the other front-end: " + (closed ? "" : closed.error().message));
  const double want = before + total;
  const auto m = e2e::wait_metrics(b, kToken, [&](const nlohmann::json& j) { return e2e::metric(j, "samples/steps_reported") >= want; }, 200);
  CHECK(e2e::metric(m, "samples/steps_reported") == want,
        "every step once on the second front-end: " + std::to_string(e2e::metric(m, "samples/steps_reported") - before) +
            " of " + std::to_string(total));
}

void other_run(std::unique_ptr<e2e::ServerProcess>& b, const e2e::ServerProcess& pendulum) {
  auto o = options();
  o.timeouts.reconnect = 20;
  auto client = rlserve::Client::connect(b->address() + "," + pendulum.address(), o);
  CHECK(client.ok(), "connect");
  if (!client) return;
  b->kill9();
  b.reset();
  // A random id's start is pipelined: the lost connection may show only on the next call.
  std::optional<rlserve::Error> refused;
  auto started = (*client)->start_episode();
  if (!started) {
    refused = started.error();
  } else if (auto action = (*client)->get_action(*started, std::vector<float>{0.01f, -0.02f, 0.03f, 0.04f}); !action) {
    refused = action.error();
  }
  CHECK(refused && refused->code == rlserve::ErrorCode::invalid_argument, "a front-end of another run is refused");
  if (refused) {
    CHECK(refused->message.find("remove '" + pendulum.address() + "'") != std::string::npos, refused->message);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <python bin dir>\n", argv[0]);
    return 2;
  }
  char tmpl[] = "/tmp/rlserve-cpp-front-ends-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 2;
  Context ctx{argv[1], tmpl};
  try {
    auto a = launch(ctx), b = launch(ctx);
    e2e::run_cases({
        {"first_that_answers", [&] { first_that_answers(*a, *b); }},
        {"remote_moves", [&] { remote_moves(a, *b); }},
    });
    auto c = launch(ctx);
    e2e::run_cases({{"local_moves", [&] { local_moves(c, *b); }}});
    auto pendulum = launch(ctx, "Pendulum-v1");
    e2e::run_cases({{"other_run", [&] { other_run(b, *pendulum); }}});
  } catch (const std::exception& e) {
    check::fail(__FILE__, __LINE__, e.what());
  }
  if (check::failures() == 0) std::filesystem::remove_all(ctx.work);
  return check::finish("e2e_front_ends");
}
