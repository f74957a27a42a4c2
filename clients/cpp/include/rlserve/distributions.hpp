// Action distributions: the network's output to an action and its log-probability
// (docs/protocol.md sections 14.4, 14.4.1 and 14.4.2).
#pragma once

#include <cstdint>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/model.hpp"
#include "rlserve/random.hpp"

namespace rlserve {

/// One chosen action.
struct Action {
  /// The flat action row (section 6.3) a report carries: choice indices, bits, unclipped
  /// Gaussian values, squashed values.
  std::vector<double> row;
  /// Per column, the value sent to the simulator: clip(row + offset, low, high), e.g. the
  /// Discrete value `action_start + choice` or a clipped Box value.
  std::vector<double> env;
  /// The log-probability of `row` under the distribution (the `behaviour_logp` of a report).
  double logp = 0.0;
};

/// Chooses an action from the network output `y` (masked) and `legal` (Model::forward).
/// explore=true samples (epsilon_greedy explores with its epsilon); explore=false takes the
/// mode (argmax, the mean, bits with q > 0, epsilon_greedy's greedy choice). bad_value when a
/// mask leaves no legal choice.
Result<Action> choose_action(const Head& head, const std::vector<float>& y,
                             const std::vector<std::uint8_t>& legal, bool explore,
                             RandomSource& random);

/// The log-probability of a given flat action row (e.g. an action the caller took itself);
/// bad_value for a row that does not fit the head (wrong width, a choice out of range or
/// illegal, a bit that is not 0/1, a squashed value outside its bounds).
Result<double> log_probability(const Head& head, const std::vector<float>& y,
                               const std::vector<std::uint8_t>& legal, const std::vector<double>& row);

}  // namespace rlserve
