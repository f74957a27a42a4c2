// The codec against every vector of docs/protocol-vectors/messages.json, and bad bodies.
#include <cstdio>
#include <set>
#include <string>

#include "check.hpp"
#include "rlserve/codec.hpp"
#include "rlserve/messages.hpp"
#include "rlserve/random.hpp"
#include "vectors.hpp"

using rlserve::ErrorCode;
using rlserve::Value;

namespace {

using Bytes = std::vector<std::uint8_t>;

ErrorCode code_of(const Bytes& b, const rlserve::Limits& limits = {}) {
  auto r = rlserve::decode_body(b.data(), b.size(), limits);
  CHECK(!r.ok(), "a bad body decoded");
  return r.ok() ? ErrorCode::internal : r.error().code;
}

/// {"a": <ext type 1 with payload>} in the shortest ext format for payloads under 256 bytes.
Bytes ext_body(const Bytes& payload, std::uint8_t type = 1) {
  Bytes b = {0x81, 0xa1, 'a', 0xc7, static_cast<std::uint8_t>(payload.size()), type};
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

void check_vectors(const std::string& path) {
  const auto file = vectors::load(path);
  std::set<std::string> dtypes, types;
  int count = 0;
  for (const auto& v : file.at("vectors")) {
    const std::string name = v.at("name").get<std::string>();
    const Bytes raw = vectors::from_hex(v.at("msgpack").get<std::string>());
    const Value want = vectors::from_tagged(v.at("value"));
    auto got = rlserve::decode_body(raw.data(), raw.size(), {});
    CHECK(got.ok(), name + ": decode failed: " + (got.ok() ? "" : got.error().message));
    if (got.ok()) CHECK(*got == want, name + ": decoded value differs from the vector's value");
    CHECK(rlserve::encode(want) == raw, name + ": encoding differs from the vector's bytes");
    if (got.ok()) CHECK(rlserve::encode(*got) == raw, name + ": re-encoding the decoded value changed bytes");
    // Every prefix of the body is a clean error (a body cut short), never a crash.
    for (std::size_t n = 0; n < raw.size(); n += (raw.size() > 4096 ? 97 : 1)) {
      auto cut = rlserve::decode_body(raw.data(), n, {});
      CHECK(!cut.ok(), name + ": a body cut at " + std::to_string(n) + " bytes decoded");
    }
    if (name.rfind("array_", 0) == 0) {
      if (got.ok() && got->find("array") && got->find("array")->as_ndarray()) {
        dtypes.insert(rlserve::dtype_name(got->find("array")->as_ndarray()->dtype()));
      }
      ++count;
      continue;
    }
    auto env = rlserve::read_envelope(want);
    CHECK(env.ok() && env->type != rlserve::MessageType::unknown, name + ": unknown message type");
    if (env.ok()) types.insert(env->type_name);
    if (env.ok() && env->type == rlserve::MessageType::welcome) {
      auto w = rlserve::read_welcome(want);
      CHECK(w.ok() && w->protocol_version == 1 && w->limits.max_frame_bytes == 16777216 &&
                w->instance_id.size() == 32,
            name + ": read_welcome");
    }
    if (env.ok() && env->type == rlserve::MessageType::weights) {
      auto w = rlserve::read_weights(want);
      CHECK(w.ok() && w->policy_id == "default", name + ": read_weights");
    }
    if (env.ok() && env->type == rlserve::MessageType::error) {
      auto e = rlserve::read_error(want);
      CHECK(e.ok() && (e->code == "episode_error" || e->code == "decode_error"), name + ": read_error");
      CHECK(e.ok() && (name == "error_null_id") == !e->id.has_value(), name + ": error id");
    }
    ++count;
  }
  CHECK(dtypes.size() == 12, "the vectors hold " + std::to_string(dtypes.size()) + " of the 12 dtypes");
  CHECK(types.size() == 19, "the vectors hold " + std::to_string(types.size()) + " of the 19 message types");
  std::printf("messages.json: %d vectors, %zu message types, %zu dtypes\n", count, types.size(), dtypes.size());
}

void check_bad_bodies() {
  // Not a map, trailing bytes, empty, truncated, reserved byte, non-string key, bad UTF-8.
  CHECK(code_of({}) == ErrorCode::decode_error, "empty body");
  CHECK(code_of({0x91, 0x01}) == ErrorCode::decode_error, "a list body");
  CHECK(code_of({0x80, 0x80}) == ErrorCode::decode_error, "bytes after the map");
  CHECK(code_of({0x81, 0xa1}) == ErrorCode::decode_error, "truncated");
  CHECK(code_of({0x81, 0xa1, 'a', 0xc1}) == ErrorCode::decode_error, "reserved byte 0xc1");
  CHECK(code_of({0x81, 0x01, 0x02}) == ErrorCode::decode_error, "an integer key");
  CHECK(code_of({0x81, 0xa1, 'a', 0xa2, 0xc3, 0x28}) == ErrorCode::decode_error, "invalid UTF-8");
  // Extensions: only type 1; the ndarray payload checks in section 5.3's order.
  CHECK(code_of(ext_body({10, 0}, 2)) == ErrorCode::decode_error, "extension type 2");
  CHECK(code_of(ext_body({10})) == ErrorCode::decode_error, "payload under 2 bytes");
  CHECK(code_of(ext_body({12, 0, 0, 0})) == ErrorCode::decode_error, "dtype code 12");
  CHECK(code_of(ext_body({10, 9})) == ErrorCode::limit_exceeded, "9 dimensions");
  CHECK(code_of(ext_body({10, 1, 4, 0})) == ErrorCode::decode_error, "ends inside the dimensions");
  CHECK(code_of(ext_body({10, 2, 0, 0x10, 0, 0, 0, 0x10, 0, 0})) == ErrorCode::limit_exceeded,
        "too many elements (checked before the data)");
  CHECK(code_of(ext_body({10, 1, 2, 0, 0, 0, 1, 2, 3})) == ErrorCode::decode_error, "wrong payload length");
  CHECK(code_of(ext_body({10, 8, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80,
                          0, 0, 0, 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0x80})) == ErrorCode::limit_exceeded,
        "an element count that overflows 64 bits");
  rlserve::Limits small;
  small.max_array_elements = 3;
  CHECK(code_of(ext_body({10, 1, 4, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}), small) ==
            ErrorCode::limit_exceeded,
        "declared max_array_elements");
  // Containers over max_container_len fail before their entries are read.
  CHECK(code_of({0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff}) == ErrorCode::limit_exceeded,
        "an array declaring 2^32-1 entries");
  CHECK(code_of({0xdf, 0x00, 0x01, 0x00, 0x01}) == ErrorCode::limit_exceeded, "a map of 65537 entries");
  Bytes deep = {0x81, 0xa1, 'a'};
  for (int i = 0; i < 100; ++i) deep.push_back(0x91);
  deep.push_back(0x01);
  CHECK(code_of(deep) == ErrorCode::limit_exceeded, "nesting deeper than max_depth");
  // A message without a string type, and an id that is not an integer >= 0.
  auto no_type = rlserve::read_envelope(Value(Value::Map{{"id", 1}}));
  CHECK(!no_type.ok() && no_type.error().code == ErrorCode::decode_error, "a message without 'type'");
  auto bool_id = rlserve::read_envelope(Value(Value::Map{{"type", "ping"}, {"id", true}}));
  CHECK(!bool_id.ok(), "'id': true is not an integer");
  auto neg_id = rlserve::read_envelope(Value(Value::Map{{"type", "ping"}, {"id", -5}}));
  CHECK(!neg_id.ok(), "'id': -5 is not a request id");
  // make_message leaves out nil fields and puts type and id first.
  const Value ping = rlserve::make_message(rlserve::MessageType::ping, 8, {{"seq", Value()}});
  const Bytes want = {0x82, 0xa4, 't', 'y', 'p', 'e', 0xa4, 'p', 'i', 'n', 'g', 0xa2, 'i', 'd', 0x08};
  CHECK(rlserve::encode(ping) == want, "make_message(ping, 8) is the vector's 'ping'");
}

void random_bytes(const std::string& path) {
  // Seeded random bodies and mutated vectors: every one decodes or fails cleanly.
  const auto file = vectors::load(path);
  std::vector<Bytes> seeds;
  for (const auto& v : file.at("vectors")) seeds.push_back(vectors::from_hex(v.at("msgpack").get<std::string>()));
  rlserve::Rng rng(25);
  int decoded = 0;
  const int rounds = 20000;
  for (int i = 0; i < rounds; ++i) {
    Bytes b;
    if (i % 2 == 0) {
      b = seeds[rng.next() % seeds.size()];
      if (b.size() > 2048) b.resize(2048);
      const int flips = 1 + static_cast<int>(rng.next() % 4);
      for (int k = 0; k < flips; ++k) b[rng.next() % b.size()] = static_cast<std::uint8_t>(rng.next());
    } else {
      b.resize(rng.next() % 64);
      for (auto& x : b) x = static_cast<std::uint8_t>(rng.next());
      if (!b.empty()) b[0] = static_cast<std::uint8_t>(0x80 | (b[0] & 0x0f));  // start as a map
    }
    auto r = rlserve::decode_body(b.data(), b.size(), {});
    if (r.ok()) {
      ++decoded;
      auto again = rlserve::decode_body(b.data(), b.size(), {});
      CHECK(again.ok() && *again == *r, "decoding is deterministic");
    }
  }
  std::printf("random bodies: %d of %d decoded, the rest refused, none crashed\n", decoded, rounds);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_codec <docs/protocol-vectors/messages.json>\n");
    return 2;
  }
  check_vectors(argv[1]);
  check_bad_bodies();
  random_bytes(argv[1]);
  return check::finish("test_codec");
}
