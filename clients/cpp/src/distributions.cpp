#include "rlserve/distributions.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace rlserve {
namespace {

const double kHalfLog2Pi = 0.5 * std::log(2.0 * 3.14159265358979323846);

Error no_legal_action() {
  return make_error(ErrorCode::bad_value,
                    "observation has an 'action_mask' with no legal action; mark at least one "
                    "legal action with 1, or end the episode instead of asking for an action");
}

/// The categorical rule on y[o, o+n): max, weights and their sum (illegal weights are 0).
struct Softmax {
  double max = 0.0, sum = 0.0;
  std::vector<double> w;
};

Result<Softmax> softmax(const std::vector<float>& y, const std::vector<std::uint8_t>& legal,
                        std::size_t o, std::size_t n) {
  Softmax s;
  bool any = false;
  for (std::size_t j = 0; j < n; ++j) {
    if (!legal[o + j]) continue;
    s.max = any ? std::max(s.max, static_cast<double>(y[o + j])) : y[o + j];
    any = true;
  }
  if (!any) return no_legal_action();
  s.w.assign(n, 0.0);
  for (std::size_t j = 0; j < n; ++j) {
    if (legal[o + j]) s.w[j] = std::exp(static_cast<double>(y[o + j]) - s.max);
    s.sum += s.w[j];
  }
  return s;
}

/// The first index of the largest legal value of y[o, o+n).
std::size_t argmax_legal(const std::vector<float>& y, const std::vector<std::uint8_t>& legal,
                         std::size_t o, std::size_t n) {
  std::size_t best = n;
  for (std::size_t j = 0; j < n; ++j) {
    if (legal[o + j] && (best == n || y[o + j] > y[o + best])) best = j;
  }
  return best;
}

double softplus(double q) { return std::max(q, 0.0) + std::log1p(std::exp(-std::abs(q))); }

double scaled(const Head& h, std::size_t col, double u) {
  return h.scale.empty() ? u : static_cast<double>(h.bias[col]) + static_cast<double>(h.scale[col]) * u;
}

double unscaled(const Head& h, std::size_t col, double a) {
  return h.scale.empty() ? a : (a - static_cast<double>(h.bias[col])) / static_cast<double>(h.scale[col]);
}

Result<Action> epsilon_greedy(const Head& h, const std::vector<float>& y,
                              const std::vector<std::uint8_t>& legal, bool explore, RandomSource& r) {
  const std::size_t n_all = h.action_dim;
  const std::size_t g = argmax_legal(y, legal, 0, n_all);
  if (g == n_all) return no_legal_action();
  std::size_t n = 0;
  for (std::size_t j = 0; j < n_all; ++j) n += legal[j] ? 1 : 0;
  std::size_t a = g;
  if (explore && h.epsilon > 0.0 && r.uniform() < h.epsilon) {
    const auto k = std::min(static_cast<std::size_t>(r.uniform() * static_cast<double>(n)), n - 1);
    for (std::size_t j = 0, seen = 0; j < n_all; ++j) {
      if (!legal[j]) continue;
      if (seen++ == k) { a = j; break; }
    }
  }
  const double eps = h.epsilon, dn = static_cast<double>(n);
  Action act;
  act.row = {static_cast<double>(a)};
  act.env = {static_cast<double>(a) + h.offsets[0]};
  act.logp = a == g ? std::log(1.0 - eps + eps / dn) : std::log(eps / dn);
  return act;
}

}  // namespace

Result<Action> choose_action(const Head& h, const std::vector<float>& y,
                             const std::vector<std::uint8_t>& legal, bool explore, RandomSource& r) {
  if (y.size() != h.action_dim || legal.size() != h.action_dim) {
    return make_error(ErrorCode::invalid_argument, "network output width differs from action_dim");
  }
  if (h.kind == DistributionKind::epsilon_greedy) return epsilon_greedy(h, y, legal, explore, r);
  Action act;
  std::size_t o = 0, log_std_at = 0;
  for (const ActionPart& p : h.parts) {
    const std::size_t col = act.row.size();
    switch (p.kind) {
      case PartKind::categorical: {
        auto s = softmax(y, legal, o, p.size);
        if (!s) return s.error();
        std::size_t a;
        if (explore) {
          const double u = r.uniform() * s->sum;
          double cum = 0.0;
          a = p.size;
          std::size_t last_legal = 0;
          for (std::size_t j = 0; j < p.size; ++j) {
            if (s->w[j] > 0.0) last_legal = j;
            cum += s->w[j];
            if (cum > u) { a = j; break; }
          }
          if (a == p.size) a = last_legal;  // rounding left none
        } else {
          a = argmax_legal(y, legal, o, p.size);
        }
        act.row.push_back(static_cast<double>(a));
        act.logp += static_cast<double>(y[o + a]) - s->max - std::log(s->sum);
        o += p.size;
        break;
      }
      case PartKind::bernoulli:
        for (std::size_t j = 0; j < p.size; ++j) {
          const double q = y[o + j];
          const bool bit = explore ? r.uniform() < 1.0 / (1.0 + std::exp(-q)) : q > 0.0;
          act.row.push_back(bit ? 1.0 : 0.0);
          act.logp += (bit ? q : 0.0) - softplus(q);
        }
        o += p.size;
        break;
      case PartKind::gaussian:
        for (std::size_t j = 0; j < p.size; ++j) {
          const double ls = h.log_std[log_std_at + j];
          const double e = explore ? r.normal() : 0.0;
          const double u = static_cast<double>(y[o + j]) + std::exp(ls) * e;
          act.row.push_back(scaled(h, col + j, u));
          act.logp += -0.5 * e * e - ls - kHalfLog2Pi;
        }
        o += p.size;
        log_std_at += p.size;
        break;
      case PartKind::squashed_gaussian:
        // In double precision from the network's output on (section 14.4).
        for (std::size_t j = 0; j < p.size; ++j) {
          const double mean = y[o + j];
          const double ls = std::clamp(static_cast<double>(y[o + p.size + j]), -20.0, 2.0);
          const double e = explore ? r.normal() : 0.0;
          const double u = mean + std::exp(ls) * e;
          const double t = std::tanh(u);
          const double low = h.low[col + j], high = h.high[col + j], half = (high - low) / 2.0;
          const double a = std::clamp(low + (t + 1.0) * half, low, high);
          act.row.push_back(static_cast<double>(static_cast<float>(a)));
          act.logp += -0.5 * e * e - ls - kHalfLog2Pi - std::log(1.0 - t * t + 1e-6) - std::log(half);
        }
        o += 2 * p.size;
        break;
    }
  }
  act.env.resize(act.row.size());
  for (std::size_t c = 0; c < act.row.size(); ++c) {
    act.env[c] = std::clamp(act.row[c] + h.offsets[c], h.low[c], h.high[c]);
  }
  return act;
}

Result<double> log_probability(const Head& h, const std::vector<float>& y,
                               const std::vector<std::uint8_t>& legal, const std::vector<double>& row) {
  if (row.size() != h.columns() || y.size() != h.action_dim || legal.size() != h.action_dim) {
    return make_error(ErrorCode::bad_value, "an action row needs " + std::to_string(h.columns()) + " columns");
  }
  auto choice = [&](double v, std::size_t n, std::size_t o) -> Result<std::size_t> {
    if (!(v >= 0.0) || v != std::floor(v) || v >= static_cast<double>(n) || !legal[o + static_cast<std::size_t>(v)]) {
      return make_error(ErrorCode::bad_value, "choice " + std::to_string(v) + " is not a legal choice index of " + std::to_string(n));
    }
    return static_cast<std::size_t>(v);
  };
  if (h.kind == DistributionKind::epsilon_greedy) {
    const std::size_t g = argmax_legal(y, legal, 0, h.action_dim);
    if (g == h.action_dim) return no_legal_action();
    auto a = choice(row[0], h.action_dim, 0);
    if (!a) return a.error();
    double n = 0;
    for (auto l : legal) n += l ? 1 : 0;
    return *a == g ? std::log(1.0 - h.epsilon + h.epsilon / n) : std::log(h.epsilon / n);
  }
  double logp = 0.0;
  std::size_t o = 0, col = 0, log_std_at = 0;
  for (const ActionPart& p : h.parts) {
    switch (p.kind) {
      case PartKind::categorical: {
        auto s = softmax(y, legal, o, p.size);
        if (!s) return s.error();
        auto a = choice(row[col], p.size, o);
        if (!a) return a.error();
        logp += static_cast<double>(y[o + *a]) - s->max - std::log(s->sum);
        o += p.size;
        col += 1;
        break;
      }
      case PartKind::bernoulli:
        for (std::size_t j = 0; j < p.size; ++j, ++col) {
          if (row[col] != 0.0 && row[col] != 1.0) return make_error(ErrorCode::bad_value, "a Bernoulli column must be 0 or 1");
          const double q = y[o + j];
          logp += row[col] * q - softplus(q);
        }
        o += p.size;
        break;
      case PartKind::gaussian:
        for (std::size_t j = 0; j < p.size; ++j, ++col) {
          const double ls = h.log_std[log_std_at + j];
          const double e = (unscaled(h, col, row[col]) - static_cast<double>(y[o + j])) / std::exp(ls);
          logp += -0.5 * e * e - ls - kHalfLog2Pi;
        }
        o += p.size;
        log_std_at += p.size;
        break;
      case PartKind::squashed_gaussian:
        for (std::size_t j = 0; j < p.size; ++j, ++col) {
          const double low = h.low[col], high = h.high[col], half = (high - low) / 2.0;
          const double t = (row[col] - low) / half - 1.0;
          if (!(t > -1.0 && t < 1.0)) return make_error(ErrorCode::bad_value, "a squashed Gaussian value must lie strictly inside its bounds");
          const double u = std::atanh(t);
          const double ls = std::clamp(static_cast<double>(y[o + p.size + j]), -20.0, 2.0);
          const double e = (u - static_cast<double>(y[o + j])) / std::exp(ls);
          logp += -0.5 * e * e - ls - kHalfLog2Pi - std::log(1.0 - t * t + 1e-6) - std::log(half);
        }
        o += 2 * p.size;
        break;
    }
  }
  return logp;
}

}  // namespace rlserve
