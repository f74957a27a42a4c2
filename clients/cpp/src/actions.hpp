// Actions out of replies, and batches of observations into requests (private to the library).
#pragma once

#include <cstddef>
#include <vector>

#include "rlserve/client.hpp"

namespace rlserve {

/// An action value as an ServerAction (its numbers collected in order).
ServerAction action_of(const Value& action);
/// A batched reply's `actions`: one stacked array [N, ...] or a list of N values.
Result<std::vector<ServerAction>> actions_of(const Value& actions, std::size_t count);
/// Observations of a batch as the wire wants them (section 6.3): one [N, *shape] array of the
/// space's dtype for a Box space, a list of N values for every other space.
Result<Value> stack_observations(const Space& space, const std::vector<Value>& observations);

}  // namespace rlserve
