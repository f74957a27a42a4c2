// Space descriptions (docs/protocol.md section 6.2) and flattening values that fit them (6.3,
// 14.3): what a local-inference client does to an observation before the network reads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/ndarray.hpp"
#include "rlserve/value.hpp"

namespace rlserve {

/// One space of a description: Box, Discrete, MultiDiscrete, MultiBinary, Dict or Tuple.
struct Space {
  enum class Type { box, discrete, multi_discrete, multi_binary, dict, tuple };
  Type type = Type::box;
  std::vector<std::uint32_t> shape;   ///< Box, MultiDiscrete (nvec's nesting), MultiBinary
  DType dtype = DType::float32;       ///< Box, MultiDiscrete
  std::vector<double> low, high;      ///< Box: per element, infinite where unbounded
  std::int64_t n = 0, start = 0;      ///< Discrete
  std::vector<std::int64_t> nvec, starts;  ///< MultiDiscrete: per element, row-major
  /// Dict: entries sorted by key (Unicode code point order, as flattening reads them);
  /// Tuple: entries in order, with empty names.
  std::vector<std::pair<std::string, Space>> entries;

  /// Elements of one value (the product of shape; 1 for a scalar).
  std::size_t elements() const noexcept;
  /// Length of a flattened value (section 14.3).
  std::size_t flat_dim() const noexcept;
  /// A short text for messages, e.g. "Box(4,)" or "Discrete(2, start=0)".
  std::string describe() const;
};

/// A shape as Python writes it: "(4,)", "(2, 3)", "()".
std::string shape_text(const std::vector<std::uint32_t>& shape);

/// Parses a description (a `welcome.policies[...].observation_space`, say): decode_error for a
/// malformed one, limit_exceeded past 8 levels of nesting or 4,000,000 elements.
Result<Space> parse_space(const Value& description);

/// Checks that `value` fits `space` (section 6.3) and appends its flattening (14.3) to `out`
/// as float32. bad_value names where (`observation['camera'][2]`), what was expected and what
/// arrived; `out` is unchanged on failure.
Status flatten(const Space& space, const Value& value, std::vector<float>& out,
               const std::string& where = "observation");

}  // namespace rlserve
