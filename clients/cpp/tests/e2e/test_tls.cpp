// TLS end to end: a real `rlserve serve --tls-cert --tls-key` with a private CA (made by the
// venv's trustme), a CartPole episode over tls://, a certificate from another CA refused, and a
// plain connection to the TLS server failing with a hint.
// Usage: test_e2e_tls <python bin dir>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>

#include "../../examples/cartpole.hpp"
#include "../check.hpp"
#include "rlserve/client.hpp"
#include "rlserve/transport.hpp"
#include "server_process.hpp"

namespace {

const char* kPki = R"(
import sys, trustme
folder = sys.argv[1]
ca = trustme.CA()
issued = ca.issue_cert("localhost", "127.0.0.1")
ca.cert_pem.write_to_path(folder + "/ca.pem")
open(folder + "/cert.pem", "wb").write(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
issued.private_key_pem.write_to_path(folder + "/key.pem")
trustme.CA().cert_pem.write_to_path(folder + "/other_ca.pem")
)";

rlserve::Result<std::unique_ptr<rlserve::Client>> connect(const std::string& address, const std::string& ca) {
  rlserve::ClientOptions o;
  o.tls_ca = ca;
  o.timeouts.request = 30;
  o.timeouts.reconnect = 2;
  return rlserve::Client::connect(address, o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return std::fprintf(stderr, "usage: %s <python bin dir>\n", argv[0]), 2;
  if (!rlserve::tls_available()) {
    std::printf("e2e_tls: this build has no OpenSSL; skipped\n");
    return 77;  // ctest's SKIP_RETURN_CODE
  }
  const std::string bin = argv[1];
  char tmpl[] = "/tmp/rlserve-cpp-tls-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 2;
  const std::string work = tmpl;
  {
    std::FILE* script = std::fopen((work + "/pki.py").c_str(), "w");
    std::fputs(kPki, script);
    std::fclose(script);
  }
  if (std::system((bin + "/python " + work + "/pki.py " + work).c_str()) != 0) {
    check::fail(__FILE__, __LINE__, "cannot make the test certificates with trustme (pip install trustme)");
    return check::finish("e2e_tls");
  }
  std::unique_ptr<e2e::ServerProcess> server;
  try {
    server = std::make_unique<e2e::ServerProcess>(
        bin,
        std::vector<std::string>{"--spaces-from", "CartPole-v1", "--run-dir", work, "--name", "run", "--port", "0",
                                 "--http-port", "0", "--no-progress", "--ppo-device", "cpu", "--tls-cert",
                                 work + "/cert.pem", "--tls-key", work + "/key.pem"},
        std::vector<std::string>{}, work + "/server.log");
    const std::string tls_address = "tls://" + server->address();

    auto client = connect(tls_address, work + "/ca.pem");
    CHECK(client.ok(), "tls:// with the CA: " + (client ? "" : client.error().message));
    if (client) {
      cartpole::CartPole env(3);
      auto obs = env.reset();
      auto id = (*client)->start_episode();
      int steps = 0;
      for (bool done = !id.ok(); !done; ++steps) {
        auto a = (*client)->get_action(*id, std::vector<float>(obs.begin(), obs.end()));
        CHECK(a.ok(), "get_action over TLS: " + (a ? "" : a.error().message));
        if (!a) break;
        auto step = env.step(static_cast<int>(a->discrete()));
        obs = step.observation;
        (*client)->log_returns(*id, step.reward);
        done = step.terminated || step.truncated;
        if (done) CHECK((*client)->end_episode(*id, std::vector<float>(obs.begin(), obs.end()), step.truncated).ok(), "end");
      }
      CHECK(steps > 0 && (*client)->close().ok(), "an episode over TLS");
    }

    auto other = connect(tls_address, work + "/other_ca.pem");
    CHECK(!other && other.error().code == rlserve::ErrorCode::tls_error, "another CA's certificate is refused");
    if (!other) CHECK(other.error().message.find("certificate") != std::string::npos, other.error().message);

    auto plain = connect(server->address(), "");
    CHECK(!plain.ok(), "a plain connection to a TLS server fails");
    if (!plain) CHECK(plain.error().message.find("tls://") != std::string::npos, "names tls://: " + plain.error().message);
  } catch (const std::exception& e) {
    check::fail(__FILE__, __LINE__, e.what());
  }
  if (check::failures() != 0 && server) std::fprintf(stderr, "server log:\n%s\n", server->log().c_str());
  server.reset();
  if (check::failures() == 0) std::filesystem::remove_all(work);
  return check::finish("e2e_tls");
}
