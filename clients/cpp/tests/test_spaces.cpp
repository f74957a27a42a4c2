// Space descriptions and flattening (protocol sections 6.2, 6.3 and 14.3).
#include <cmath>
#include <cstdio>
#include <string>

#include "check.hpp"
#include "rlserve/codec.hpp"
#include "rlserve/spaces.hpp"
#include "vectors.hpp"

using rlserve::ErrorCode;
using rlserve::Value;

namespace {

Value json(const std::string& text) { return vectors::from_tagged(vectors::Json::parse(text)); }

rlserve::Space space(const std::string& text) {
  auto s = rlserve::parse_space(json(text));
  if (!s) {
    std::fprintf(stderr, "%s: %s\n", text.c_str(), s.error().message.c_str());
    std::exit(1);
  }
  return std::move(s).value();
}

void refused(const rlserve::Space& s, const std::string& value, const std::string& needle, const std::string& what) {
  std::vector<float> out = {7.0f};
  auto r = rlserve::flatten(s, json(value), out);
  CHECK(!r.ok() && r.error().code == ErrorCode::bad_value && r.error().message.find(needle) != std::string::npos,
        what + (r.ok() ? ": accepted" : ": got '" + r.error().message + "'"));
  CHECK(out.size() == 1, what + ": nothing appended");
}

void section_14_3_example() {
  // Keys deliberately out of order: flattening sorts them.
  const auto s = space(R"({"type":"Dict","spaces":{
      "z":{"type":"Discrete","n":3,"start":-1},
      "a":{"type":"MultiDiscrete","nvec":[2,3],"start":[1,0]},
      "t":{"type":"Tuple","spaces":[{"type":"Discrete","n":2}]},
      "b":{"type":"Box","shape":[2]},
      "m":{"type":"MultiBinary","n":[2]}}})");
  CHECK(s.flat_dim() == 14, "flat_dim 14");
  std::vector<float> out;
  auto r = rlserve::flatten(s, json(R"({"z":0,"a":[2,1],"m":[1,0],"b":[0.5,-0.5],"t":[1]})"), out);
  CHECK(r.ok(), "the example fits: " + (r ? std::string() : r.error().message));
  const std::vector<float> want = {0, 1, 0, 1, 0, 0.5f, -0.5f, 1, 0, 0, 1, 0, 1, 0};
  CHECK(out == want, "section 14.3's 14 numbers");
  refused(s, R"({"z":0,"a":[2,1],"m":[1,0],"b":[0.5,-0.5]})", "'t' is missing", "a missing key");
  refused(s, R"({"z":0,"a":[2,1],"m":[1,0],"b":[0.5,-0.5],"t":[1],"x":1})", "'x'", "an extra key");
  refused(s, R"({"z":true,"a":[2,1],"m":[1,0],"b":[0.5,-0.5],"t":[1]})", "observation['z']", "a boolean for Discrete");
  refused(s, R"({"z":2,"a":[2,1],"m":[1,0],"b":[0.5,-0.5],"t":[1]})", "valid values are -1..1", "Discrete out of range");
  refused(s, R"({"z":0,"a":[3,1],"m":[1,0],"b":[0.5,-0.5],"t":[1]})", "observation['a']", "MultiDiscrete out of range");
  refused(s, R"({"z":0,"a":[2.0,1],"m":[1,0],"b":[0.5,-0.5],"t":[1]})", "real numbers", "reals for MultiDiscrete");
  refused(s, R"({"z":0,"a":[2,1],"m":[1,2],"b":[0.5,-0.5],"t":[1]})", "not 0 or 1", "MultiBinary 2");
  refused(s, R"({"z":0,"a":[2,1],"m":[1,0],"b":[0.5],"t":[1]})", "shape (2,)", "a Box list of the wrong length");
  refused(s, R"({"z":0,"a":[2,1],"m":[1,0],"b":[0.5,-0.5],"t":[1,0]})", "Tuple", "a Tuple of the wrong length");
}

void cartpole_from_welcome(const std::string& messages) {
  const auto file = vectors::load(messages);
  Value welcome, get_action;
  for (const auto& v : file.at("vectors")) {
    if (v.at("name") == "welcome") welcome = vectors::from_tagged(v.at("value"));
    if (v.at("name") == "get_action") get_action = vectors::from_tagged(v.at("value"));
  }
  const Value* desc = welcome.find("policies")->find("default")->find("observation_space");
  auto s = rlserve::parse_space(*desc);
  CHECK(s.ok() && s->type == rlserve::Space::Type::box && s->flat_dim() == 4, "CartPole's Box(4,)");
  if (!s) return;
  CHECK(std::isinf(s->high[1]) && s->high[1] > 0 && std::fabs(s->high[0] - 4.800000190734863) < 1e-12, "null bounds are unbounded");
  std::vector<float> out;
  auto r = rlserve::flatten(*s, *get_action.find("observation"), out);
  CHECK(r.ok() && out == std::vector<float>({0.015625f, -0.25f, 0.03125f, 0.5f}), "the get_action vector's observation flattens to itself");
  auto action = rlserve::parse_space(*welcome.find("policies")->find("default")->find("action_space"));
  CHECK(action.ok() && action->type == rlserve::Space::Type::discrete && action->n == 2, "CartPole's Discrete(2)");
  refused(*s, "[0.0, 0.0, 9.0, 0.0]", "value 9 at index (2,) is above the space's high bound 0.418879032", "above the bound");
  refused(*s, "[0.0, 0.0, 0.0]", "expected", "three values for Box(4,)");
  refused(*s, "[1e39, 0.0, 0.0, 0.0]", "not a finite float32", "a float64 that overflows float32");
  refused(*s, R"({"$ndarray":{"dtype":"float32","shape":[1,4],"data":[0,0,0,0]}})", "expected shape (4,)", "a [1, 4] array");
  refused(*s, R"({"$ndarray":{"dtype":"float32","shape":[4],"data":[0,"NaN",0,0]}})", "index (1,)", "NaN");
  const auto image = space(R"({"type":"Box","shape":[2,2],"dtype":"uint8","low":0,"high":255})");
  refused(image, "[[1.5, 0], [0, 0]]", "real numbers", "reals for a uint8 Box");
  std::vector<float> pixels;
  CHECK(rlserve::flatten(image, json(R"({"$ndarray":{"dtype":"uint8","shape":[2,2],"data":[0,51,255,7]}})"), pixels).ok() &&
            pixels == std::vector<float>({0, 51, 255, 7}),
        "a uint8 image flattens to its values");
}

void masked_observation() {
  // masked-forward-pass.json's Dict(action_mask=MultiBinary(3), observations=Box(-inf, inf, (2,))).
  const auto s = space(R"({"type":"Dict","spaces":{"observations":{"type":"Box","shape":[2]},
                                                  "action_mask":{"type":"MultiBinary","n":[3]}}})");
  std::vector<float> out;
  auto r = rlserve::flatten(s, json(R"({"observations":[1.0,0.5],"action_mask":[1,0,1]})"), out);
  CHECK(r.ok() && out == std::vector<float>({1, 0, 1, 1.0f, 0.5f}), "the mask comes first (sorted keys)");
}

void bad_descriptions() {
  auto expect = [](const std::string& text, ErrorCode code, const std::string& what) {
    auto s = rlserve::parse_space(json(text));
    CHECK(!s.ok() && s.error().code == code, what);
  };
  expect(R"({"type":"Graph"})", ErrorCode::decode_error, "an unknown space type");
  expect(R"({"type":"Discrete","n":0})", ErrorCode::decode_error, "Discrete(0)");
  expect(R"({"type":"Box","shape":[2],"low":[0,0,0]})", ErrorCode::decode_error, "a bound of the wrong length");
  expect(R"({"type":"Box","shape":[4000,4000]})", ErrorCode::limit_exceeded, "16,000,000 elements");
  expect(R"({"type":"MultiDiscrete","nvec":[[2,3],[4]]})", ErrorCode::decode_error, "a ragged nvec");
  std::string deep = R"({"type":"Discrete","n":2})";
  for (int i = 0; i < 9; ++i) deep = R"({"type":"Tuple","spaces":[)" + deep + "]}";
  expect(deep, ErrorCode::limit_exceeded, "Tuples nested 9 deep");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_spaces <docs/protocol-vectors/messages.json>\n");
    return 2;
  }
  section_14_3_example();
  cartpole_from_welcome(argv[1]);
  masked_observation();
  bad_descriptions();
  return check::finish("test_spaces");
}
