// Plain numbers to and from values of a space (private to the library): what the C ABI and the
// plain-number calls pass instead of a Value. The order is ServerAction::values': a Discrete is
// one number (its value), a Box's, MultiDiscrete's or MultiBinary's elements row-major, a Dict's
// members in key order, a Tuple's in order.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "rlserve/spaces.hpp"
#include "rlserve/value.hpp"

namespace rlserve {

/// How many numbers one value of `space` takes.
std::size_t number_count(const Space& space) noexcept;

/// `numbers` as a value of `space` (an array of its shape and dtype for a Box, MultiDiscrete or
/// MultiBinary, an integer for a Discrete, a map or list for a Dict or Tuple). bad_value, naming
/// `what` and the space, when the count does not fit; the values themselves are not checked.
Result<Value> value_from_numbers(const Space& space, const std::vector<double>& numbers, const std::string& what);

}  // namespace rlserve
