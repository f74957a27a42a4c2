// Reading docs/protocol-vectors/: JSON files, hex bytes and tagged values (see its README).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlserve/value.hpp"

namespace vectors {

using Json = nlohmann::ordered_json;

/// The JSON file at `path` (aborts the test with a message when it cannot be read).
Json load(const std::string& path);
/// Lowercase hex to bytes.
std::vector<std::uint8_t> from_hex(const std::string& hex);
/// A tagged JSON value to a Value: a number with a decimal point or exponent is a float 64,
/// {"$ndarray": ...} an array of its dtype (non-finite reals as "NaN"/"Infinity"/"-Infinity").
rlserve::Value from_tagged(const Json& j);
/// A JSON list of numbers as doubles (null as NaN).
std::vector<double> numbers(const Json& j);

}  // namespace vectors
