// msgpack bodies <-> Values (docs/protocol.md sections 3.2 and 5.3).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/limits.hpp"
#include "rlserve/value.hpp"

namespace rlserve {

/// Decodes one frame body: exactly one msgpack map with string keys, nothing left over.
/// decode_error for bytes that are not that (invalid msgpack, a non-map body, a non-string key,
/// invalid UTF-8, an extension type other than 1, a malformed ndarray); limit_exceeded for a
/// container, array or nesting over `limits`, checked before anything is allocated for it.
Result<Value> decode_body(const std::uint8_t* data, std::size_t size, const Limits& limits);

/// Encodes a value in the server's shortest forms (section 3.2): the smallest integer, string,
/// container and extension formats, reals in the width they have (float 32 or float 64), map
/// keys in the Value's order. For a value decoded from the server's bytes this gives those bytes.
std::vector<std::uint8_t> encode(const Value& value);

}  // namespace rlserve
