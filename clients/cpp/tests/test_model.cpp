// Model kinds the vector files do not cover (multi_categorical, bernoulli, composite with
// action scaling), refused descriptions, and a Policy built from the server's `weights` vector.
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

#include "check.hpp"
#include "rlserve/codec.hpp"
#include "rlserve/distributions.hpp"
#include "rlserve/policy.hpp"
#include "scripted.hpp"
#include "vectors.hpp"

using rlserve::ErrorCode;
using rlserve::Value;

namespace {

/// A one-layer model whose output is `y` whatever the observation (zero weights, bias y).
std::pair<Value, Value> constant_model(const std::string& distribution, const std::vector<float>& y,
                                       Value::Map extra, Value::Map extra_arrays = {}) {
  Value::Array layers{Value("head")};
  Value::Map model{{"obs_dim", 1}, {"actor_layers", layers}, {"activation", "tanh"},
                   {"distribution", distribution}, {"action_dim", static_cast<std::int64_t>(y.size())}};
  for (auto& kv : extra) model.push_back(kv);
  std::vector<float> zeros(y.size(), 0.0f);
  Value::Map arrays{{"head.weight", rlserve::NDArray::from_floats(zeros.data(), {static_cast<std::uint32_t>(y.size()), 1})},
                    {"head.bias", rlserve::NDArray::from_floats(y.data(), {static_cast<std::uint32_t>(y.size())})}};
  for (auto& kv : extra_arrays) arrays.push_back(kv);
  return {Value(model), Value(arrays)};
}

Value parts(std::initializer_list<std::pair<const char*, int>> ps) {
  Value::Array out;
  for (const auto& [k, n] : ps) out.push_back(Value::Map{{"kind", k}, {"size", n}});
  return out;
}

Value list(std::initializer_list<double> xs) {
  Value::Array out;
  for (double x : xs) out.push_back(x);
  return out;
}

void multi_categorical() {
  // Section 14.4.1's example: MultiDiscrete([3, 2], start=[1, -1]), y = [0.1, 2.0, -1.0, 0.3, -0.2].
  const double inf = std::numeric_limits<double>::infinity();
  auto [model, arrays] = constant_model(
      "multi_categorical", {0.1f, 2.0f, -1.0f, 0.3f, -0.2f},
      {{"action_parts", parts({{"categorical", 3}, {"categorical", 2}})}, {"action_offsets", list({1, -1})},
       {"action_low", list({-inf, -inf})}, {"action_high", list({inf, inf})}});
  auto m = rlserve::Model::parse(model, arrays);
  CHECK(m.ok(), "multi_categorical parses: " + (m ? std::string() : m.error().message));
  if (!m) return;
  const float obs = 0.0f;
  std::vector<float> y;
  std::vector<std::uint8_t> legal;
  m->forward(&obs, nullptr, nullptr, y, legal);
  Scripted s;
  auto g = rlserve::choose_action(m->head(), y, legal, false, s);
  CHECK(g.ok() && g->row == std::vector<double>({1, 0}) && g->env == std::vector<double>({2, -1}),
        "multi_categorical greedy row [1, 0] sent as [2, -1]");
  const double want = (2.0 - std::log(std::exp(0.1) + std::exp(2.0) + std::exp(-1.0))) +
                      (0.3 - std::log(std::exp(0.3) + std::exp(-0.2)));
  CHECK(g.ok() && check::near(g->logp, want, 1e-5, 1e-6) && check::near(want, -0.65586, 0, 1e-5),
        "multi_categorical greedy logp -0.65586");
  // A uniform draw of 0.99 lands on the last choice of each part.
  s.uniforms = {0.99, 0.99};
  auto a = rlserve::choose_action(m->head(), y, legal, true, s);
  CHECK(a.ok() && a->row == std::vector<double>({2, 1}) && a->env == std::vector<double>({3, 0}),
        "multi_categorical sampled row [2, 1] sent as [3, 0]");
}

void composite_scaled() {
  // Dict{gear: Discrete(3, start=1), lights: MultiBinary(2), steer: Box(-2, 2, (1,))} with
  // normalised Gaussian units (scale 2, bias 0) for the Box column.
  const double inf = std::numeric_limits<double>::infinity();
  const float ls = -0.5f;
  auto [model, arrays] = constant_model(
      "composite", {0.5f, 1.5f, -0.25f, 0.75f, -2.0f, 0.25f},
      {{"action_parts", parts({{"categorical", 3}, {"bernoulli", 2}, {"gaussian", 1}})},
       {"action_offsets", list({1, 0, 0, 0})}, {"action_low", list({-inf, -inf, -inf, -2})},
       {"action_high", list({inf, inf, inf, 2})}, {"action_scale", list({1, 1, 1, 2})},
       {"action_bias", list({0, 0, 0, 0})}},
      {{"log_std", rlserve::NDArray::from_floats(&ls, {1})}});
  auto m = rlserve::Model::parse(model, arrays);
  CHECK(m.ok(), "composite parses: " + (m ? std::string() : m.error().message));
  if (!m) return;
  CHECK(m->head().columns() == 4, "composite has 4 columns");
  const float obs = 0.0f;
  std::vector<float> y;
  std::vector<std::uint8_t> legal;
  m->forward(&obs, nullptr, nullptr, y, legal);
  auto softplus = [](double q) { return std::log1p(std::exp(q)); };
  const double lse = std::log(std::exp(0.5) + std::exp(1.5) + std::exp(-0.25));
  const double half_log_2pi = 0.5 * std::log(2 * 3.14159265358979323846);
  Scripted none;
  auto g = rlserve::choose_action(m->head(), y, legal, false, none);
  const double g_logp = (1.5 - lse) + (0.75 - softplus(0.75)) + (0.0 - softplus(-2.0)) + (0.5 - half_log_2pi);
  CHECK(g.ok() && g->row == std::vector<double>({1, 1, 0, 0.5}) && g->env == std::vector<double>({2, 1, 0, 0.5}),
        "composite greedy: the mode of each part, the Box mean scaled by 2");
  CHECK(g.ok() && check::near(g->logp, g_logp, 1e-9, 1e-9), "composite greedy logp");
  // Draws: categorical u=0.1 (choice 0), bits u=0.9 (p=0.679: 0) and u=0.05 (p=0.119: 1), e=3.
  Scripted s;
  s.uniforms = {0.1, 0.9, 0.05};
  s.normals = {3.0};
  auto a = rlserve::choose_action(m->head(), y, legal, true, s);
  const double u = 0.25 + std::exp(-0.5) * 3.0;
  CHECK(a.ok() && a->row[0] == 0 && a->row[1] == 0 && a->row[2] == 1 && check::near(a->row[3], 2 * u, 1e-6, 1e-7),
        "composite sampled row");
  CHECK(a.ok() && a->env[0] == 1 && a->env[3] == 2.0, "composite sent: offset added, the Box value clipped to 2");
  const double a_logp = (0.5 - lse) + (0.0 - softplus(0.75)) + (-2.0 - softplus(-2.0)) + (-4.5 + 0.5 - half_log_2pi);
  CHECK(a.ok() && check::near(a->logp, a_logp, 1e-6, 1e-7), "composite sampled logp");
  auto lp = rlserve::log_probability(m->head(), y, legal, a.ok() ? a->row : std::vector<double>{});
  CHECK(lp.ok() && check::near(*lp, a_logp, 1e-6, 1e-7), "log_probability of the sampled row");
  auto bad_bit = rlserve::log_probability(m->head(), y, legal, {0, 2, 0, 0});
  CHECK(!bad_bit.ok() && bad_bit.error().code == ErrorCode::bad_value, "a bit of 2 is refused");
}

void refused_models() {
  auto expect = [](Value model, Value arrays, ErrorCode code, const std::string& needle, const std::string& what) {
    auto m = rlserve::Model::parse(model, arrays);
    CHECK(!m.ok() && m.error().code == code && m.error().message.find(needle) != std::string::npos,
          what + (m.ok() ? ": parsed" : ": got '" + m.error().message + "'"));
  };
  {
    auto [model, arrays] = constant_model("beta", {0.0f, 0.0f}, {});
    expect(model, arrays, ErrorCode::unsupported_model, "'beta'", "an unknown distribution is named");
  }
  {
    auto [model, arrays] = constant_model("categorical", {0.0f, 0.0f}, {{"memory", Value::Map{{"kind", "gru"}, {"cell_size", 2}}}});
    expect(model, arrays, ErrorCode::unsupported_model, "'gru'", "an unknown memory kind is named");
  }
  {
    Value::Map image{{"kind", "transformer"}, {"start", 0}, {"shape", Value::Array{1, 1, 1}}};
    auto [model, arrays] = constant_model("categorical", {0.0f, 0.0f},
                                          {{"encoder", Value::Map{{"input_dim", 1}, {"images", Value::Array{image}}}}});
    expect(model, arrays, ErrorCode::unsupported_model, "'transformer'", "an unknown encoder kind is named");
  }
  {
    auto [model, arrays] = constant_model("categorical", {0.0f, 0.0f}, {{"activation", "gelu"}});
    auto* m = model.as_map();
    for (auto& kv : *m) if (kv.first == "activation" && kv.second == Value("tanh")) kv.second = "gelu";
    expect(model, arrays, ErrorCode::unsupported_model, "'gelu'", "an unknown activation is named");
  }
  {
    auto [model, arrays] = constant_model("categorical", {0.0f, 0.0f}, {});
    for (auto& kv : *model.as_map()) if (kv.first == "action_dim") kv.second = 3;
    expect(model, arrays, ErrorCode::decode_error, "action_dim", "a last layer narrower than action_dim");
  }
  {
    auto [model, arrays] = constant_model("categorical", {0.0f, 0.0f}, {});
    for (auto& kv : *model.as_map()) if (kv.first == "obs_dim") kv.second = 2;
    expect(model, arrays, ErrorCode::decode_error, "shape", "a weight of the wrong shape");
  }
  {
    auto [model, arrays] = constant_model("categorical", {0.0f, 0.0f}, {});
    expect(model, Value(Value::Map{}), ErrorCode::decode_error, "missing", "missing arrays");
  }
}

void policy_from_server_weights(const std::string& messages) {
  const auto file = vectors::load(messages);
  for (const auto& v : file.at("vectors")) {
    if (v.at("name") != "weights" && v.at("name") != "weights_unchanged") continue;
    const auto body = vectors::from_hex(v.at("msgpack").get<std::string>());
    auto p = rlserve::Policy::from_weights_body(body.data(), body.size());
    if (v.at("name") == "weights_unchanged") {
      CHECK(!p.ok() && p.error().code == ErrorCode::invalid_argument, "an unchanged reply builds no policy");
      continue;
    }
    CHECK(p.ok(), "the server's CartPole weights build a policy: " + (p ? std::string() : p.error().message));
    if (!p) return;
    CHECK(p->model().obs_dim() == 4 && p->model().head().kind == rlserve::DistributionKind::categorical &&
              p->version() == 0 && p->policy_id() == "default",
          "CartPole policy: obs_dim 4, categorical, version 0");
    const float obs[4] = {0.015625f, -0.25f, 0.03125f, 0.5f};
    Scripted none;
    auto g1 = p->compute_action(obs, nullptr, false, none);
    auto g2 = p->compute_action(obs, nullptr, false, none);
    CHECK(g1.ok() && g2.ok() && g1->env == g2->env && (g1->env[0] == 0 || g1->env[0] == 1),
          "greedy actions are deterministic and in Discrete(2)");
    rlserve::Rng r1(7), r2(7);
    int ones = 0;
    for (int i = 0; i < 200; ++i) {
      auto a = p->compute_action(obs, nullptr, true, r1);
      auto b = p->compute_action(obs, nullptr, true, r2);
      CHECK(a.ok() && b.ok() && a->env == b->env && a->logp == b->logp && a->logp < 0, "seeded sampling repeats");
      ones += a.ok() && a->env[0] == 1 ? 1 : 0;
    }
    CHECK(ones > 40 && ones < 160, "an untrained CartPole policy samples both actions (" + std::to_string(ones) + "/200)");
    const float nan_obs[4] = {0.0f, NAN, 0.0f, 0.0f};
    auto bad = p->compute_action(nan_obs, nullptr, true, r1);
    CHECK(!bad.ok() && bad.error().code == ErrorCode::bad_value, "a NaN observation is refused");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_model <docs/protocol-vectors/messages.json>\n");
    return 2;
  }
  multi_categorical();
  composite_scaled();
  refused_models();
  policy_from_server_weights(argv[1]);
  return check::finish("test_model");
}
