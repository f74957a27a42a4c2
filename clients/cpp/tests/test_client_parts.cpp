// The network client's parts that need no server: addresses, client ids, actions out of
// replies, observation batches, a peer that is not an rlserve server, and an rlserve server of
// another protocol version (a scripted peer that answers hello with its own welcome).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "../src/actions.hpp"
#include "../src/numbers.hpp"
#include "check.hpp"
#include "rlserve.h"
#include "rlserve/client.hpp"
#include "rlserve/codec.hpp"
#include "rlserve/framing.hpp"
#include "rlserve/local_client.hpp"
#include "rlserve/transport.hpp"

using namespace rlserve;

namespace {

void addresses() {
  auto a = parse_address("127.0.0.1:9900");
  CHECK(a.ok() && a->host == "127.0.0.1" && a->port == 9900 && !a->tls, "host:port");
  auto t = parse_address("tls://localhost:443");
  CHECK(t.ok() && t->host == "localhost" && t->port == 443 && t->tls && t->text() == "tls://localhost:443", "tls://");
  auto v6 = parse_address("[::1]:80");
  CHECK(v6.ok() && v6->host == "::1", "a bracketed IPv6 host");
  for (const char* bad : {"", "localhost", ":80", "host:", "host:0", "host:65536", "host:80x"}) {
    auto r = parse_address(bad);
    CHECK(!r && r.error().code == ErrorCode::invalid_argument, std::string("refused: '") + bad + "'");
  }
  auto list = parse_addresses("127.0.0.1:9900, tls://localhost:9910 ,[::1]:80");
  CHECK(list.ok() && list->size() == 3 && (*list)[1].tls && (*list)[1].port == 9910 && (*list)[2].host == "::1",
        "several front-ends, comma-separated, spaces trimmed");
  auto one = parse_addresses("localhost:1");
  CHECK(one.ok() && one->size() == 1, "one address is a list of one");
  for (const char* bad : {"a:1,", ",a:1", "a:1,,b:2", "a:1,b"}) {
    auto r = parse_addresses(bad);
    CHECK(!r && r.error().code == ErrorCode::invalid_argument, std::string("refused: '") + bad + "'");
  }
  auto named = parse_addresses("a:1,b");
  CHECK(!named && named.error().message.find("front-end address 'b'") != std::string::npos, "the bad entry is named");
}

void ids() {
  const std::string a = random_hex_id(), b = random_hex_id();
  CHECK(a.size() == 32 && a.find_first_not_of("0123456789abcdef") == std::string::npos, "32 hex characters");
  CHECK(a != b, "random");
}

void actions() {
  NDArray discrete(DType::int64, {3});
  for (std::size_t i = 0; i < 3; ++i) discrete.set_int64(i, static_cast<std::int64_t>(i % 2));
  auto d = actions_of(Value(discrete), 3);
  CHECK(d.ok() && d->size() == 3 && (*d)[1].discrete() == 1 && (*d)[1].value.as_int(), "stacked Discrete");
  float box[4] = {0.5f, -0.5f, 1.0f, 2.0f};
  auto b = actions_of(Value(NDArray::from_floats(box, {2, 2})), 2);
  CHECK(b.ok() && (*b)[1].values == std::vector<double>({1.0, 2.0}), "stacked Box rows");
  CHECK(b.ok() && (*b)[1].value.as_ndarray() && (*b)[1].value.as_ndarray()->shape() == std::vector<std::uint32_t>{2},
        "each row an array of the space's shape");
  auto wrong = actions_of(Value(discrete), 2);
  CHECK(!wrong && wrong.error().code == ErrorCode::decode_error, "a count that does not match");
  Value::Map dict{{"b", Value(std::int64_t{2})}, {"a", Value(Value::Array{Value(1.5), Value(2.5)})}};
  CHECK(action_of(Value(dict)).values == std::vector<double>({1.5, 2.5, 2.0}), "a Dict's numbers in key order");
}

void batches() {
  Space box;
  box.type = Space::Type::box;
  box.shape = {2};
  box.dtype = DType::float64;
  float one[2] = {1, 2}, two[2] = {3, 4};
  auto s = stack_observations(box, {Value(NDArray::from_floats(one, {2})), Value(NDArray::from_floats(two, {2}))});
  CHECK(s.ok() && s->as_ndarray() && s->as_ndarray()->shape() == std::vector<std::uint32_t>({2, 2}) &&
            s->as_ndarray()->dtype() == DType::float64 && s->as_ndarray()->get_double(3) == 4.0,
        "a Box batch is one [N, *shape] array of the space's dtype");
  Space discrete;
  discrete.type = Space::Type::discrete;
  discrete.n = 3;
  auto l = stack_observations(discrete, {Value(std::int64_t{0}), Value(std::int64_t{2})});
  CHECK(l.ok() && l->as_array() && l->as_array()->size() == 2, "other spaces: a list");
}

/// Plain numbers (the C ABI's) become values of every space type, in ServerAction::values' order:
/// numbers -> value -> numbers is the identity, and the value fits the space.
void numbers() {
  using M = Value::Map;
  using A = Value::Array;
  const Value box(M{{"type", "Box"}, {"shape", A{2}}, {"dtype", "float32"}, {"low", -1.0}, {"high", 1.0}});
  const Value pair(M{{"type", "Tuple"},
                     {"spaces", A{Value(M{{"type", "MultiDiscrete"}, {"nvec", A{3, 4}}, {"dtype", "int64"}}),
                                  Value(M{{"type", "Discrete"}, {"n", 2}})}}});
  const Value description(M{{"type", "Dict"},
                            {"spaces", M{{"steer", box},
                                         {"gear", Value(M{{"type", "Discrete"}, {"n", 3}, {"start", 1}})},
                                         {"lights", Value(M{{"type", "MultiBinary"}, {"n", A{2}}})},
                                         {"pair", pair}}}});
  auto parsed = parse_space(description);
  CHECK(parsed.ok(), "the Dict space parses: " + (parsed ? "" : parsed.error().message));
  if (!parsed) return;
  CHECK(number_count(*parsed) == 8, "1 + 2 + 2 + 1 + 2 numbers, got " + std::to_string(number_count(*parsed)));
  const std::vector<double> in{3, 1, 0, 2, 3, 1, 0.25, -0.5};  // gear, lights, pair (md, d), steer: key order
  auto value = value_from_numbers(*parsed, in, "action");
  CHECK(value.ok(), "8 numbers fit");
  if (!value) return;
  std::vector<float> flat;
  auto fits = flatten(*parsed, *value, flat, "action");
  CHECK(fits.ok(), "the value fits the space: " + (fits ? "" : fits.error().message));
  CHECK(action_of(*value).values == in, "numbers -> value -> numbers is the identity");
  CHECK(value->find("gear") && value->find("gear")->as_int() == std::int64_t{3}, "a Discrete is an integer");
  auto wrong = value_from_numbers(*parsed, {1, 2}, "action");
  CHECK(!wrong && wrong.error().code == ErrorCode::bad_value && wrong.error().message.find("expected 8") != std::string::npos,
        "a wrong count names the expected one");
}

/// A listening socket on 127.0.0.1, an ephemeral port: the socket and the port.
std::pair<int, int> listen_loopback() {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::listen(listener, 4);
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  return {listener, ntohs(addr.sin_port)};
}

/// Serves `connections` connections one after the other: reads each hello and answers it with a
/// welcome naming `protocol_version` (a CartPole policy otherwise), then waits for the client to
/// hang up. `hellos` counts the hellos it read (checked by the caller: CHECK is not thread-safe).
std::thread scripted_server(int listener, int connections, std::int64_t protocol_version, std::atomic<int>& hellos) {
  return std::thread([=, &hellos] {
    using M = Value::Map;
    using A = Value::Array;
    const Value box(M{{"type", "Box"}, {"shape", A{4}}, {"dtype", "float32"}, {"low", -1.0}, {"high", 1.0}});
    const Value policies(M{{"default", Value(M{{"observation_space", box},
                                               {"action_space", Value(M{{"type", "Discrete"}, {"n", 2}})}})}});
    for (int k = 0; k < connections; ++k) {
      const int fd = ::accept(listener, nullptr, nullptr);
      if (fd < 0) return;
      FrameReader reader;
      std::uint8_t buffer[4096];
      std::optional<Value> hello;
      while (!hello) {
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        reader.feed(buffer, static_cast<std::size_t>(n));
        auto body = reader.next();
        if (body && body->has_value()) {
          auto m = decode_body((*body)->data(), (*body)->size(), Limits{});
          if (m) hello = std::move(*m);
        }
      }
      auto env = hello ? read_envelope(*hello) : Result<Envelope>(make_error(ErrorCode::decode_error, "no hello"));
      if (env && env->type == MessageType::hello) {
        ++hellos;
        Value welcome = make_message(MessageType::welcome, env->id.value_or(0),
                                     {{"protocol_version", protocol_version}, {"server_version", "9.0"},
                                      {"instance_id", "scripted"}, {"policies", policies}});
        auto frame = encode_frame(welcome, Limits{});
        if (frame) (void)::send(fd, frame->data(), frame->size(), MSG_NOSIGNAL);
      }
      while (::recv(fd, buffer, sizeof buffer, 0) > 0) {
      }
      ::close(fd);
    }
  });
}

/// A server of protocol version 2: each client refuses it with version_mismatch naming both
/// versions (the remote and the local client, and through the C ABI a status and a message).
void other_version() {
  const auto [listener, port] = listen_loopback();
  std::atomic<int> hellos{0};
  std::thread peer = scripted_server(listener, 3, 2, hellos);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ClientOptions o;
  o.timeouts.request = 2;
  o.timeouts.reconnect = 1;
  {  // each client hangs up before the next connects (the scripted server serves one at a time)
    auto c = Client::connect(address, o);
    CHECK(!c && c.error().code == ErrorCode::version_mismatch, "another protocol version is a version_mismatch");
    if (!c) {
      CHECK(c.error().message.find("protocol version 2") != std::string::npos &&
                c.error().message.find("this client 1") != std::string::npos,
            "the message names both versions: " + c.error().message);
    }
  }
  {
    LocalOptions lo;
    lo.timeouts = o.timeouts;
    auto local = LocalClient::connect(address, lo);
    CHECK(!local && local.error().code == ErrorCode::version_mismatch, "the local client refuses it too");
  }
  rlserve_client_options co{};
  co.request_timeout = 2;
  co.reconnect_timeout = 1;
  rlserve_client* client = nullptr;
  const rlserve_status st = rlserve_client_connect(address.c_str(), nullptr, nullptr, &co, &client);
  CHECK(st == RLSERVE_VERSION_MISMATCH && client == nullptr,
        std::string("the C ABI: RLSERVE_VERSION_MISMATCH, got ") + rlserve_status_name(st));
  const std::string message = rlserve_last_error();
  CHECK(message.find("protocol version 2") != std::string::npos && message.find("matching versions") != std::string::npos,
        "the C ABI's message names the version and the fix: " + message);
  if (client != nullptr) rlserve_client_close(client);
  peer.join();
  ::close(listener);
  CHECK(hellos == 3, "each client said hello first, got " + std::to_string(hellos));
}

void not_rlserve() {
  const auto [listener, port] = listen_loopback();
  std::thread peer([listener] {  // an HTTP server, say
    const int fd = ::accept(listener, nullptr, nullptr);
    char buffer[512];
    (void)::recv(fd, buffer, sizeof buffer, 0);
    const char* reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
    (void)::send(fd, reply, std::strlen(reply), MSG_NOSIGNAL);
    ::close(fd);
  });
  ClientOptions o;
  o.timeouts.request = 10;
  auto c = Client::connect("127.0.0.1:" + std::to_string(port), o);
  peer.join();
  ::close(listener);
  CHECK(!c && c.error().code == ErrorCode::decode_error, "a peer that is not rlserve is a decode_error");
  if (!c) CHECK(c.error().message.find("binary port") != std::string::npos, c.error().message);
}

}  // namespace

int main() {
  addresses();
  ids();
  actions();
  batches();
  numbers();
  not_rlserve();
  other_version();
  return check::finish("client_parts");
}
