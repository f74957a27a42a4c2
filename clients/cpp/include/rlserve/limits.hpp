// The decode-time limits of docs/protocol.md section 10.
#pragma once

#include <cstdint>

namespace rlserve {

class Value;

/// The largest magnitude of one step's reward (docs/protocol.md section 6.4): the rewards logged
/// for one action add up to at most this, or the call is refused with bad_value.
inline constexpr double kMaxAbsReward = 1e9;

/// Limits checked while a frame is read and decoded. The defaults are the server's defaults; a
/// session replaces them with `welcome.limits` (from_welcome).
struct Limits {
  std::uint64_t max_frame_bytes = 16777216;   ///< largest frame body
  std::uint64_t max_array_elements = 4000000; ///< elements of one ndarray extension value
  std::uint32_t max_array_ndim = 8;           ///< dimensions of one ndarray extension value
  std::uint32_t max_container_len = 65536;    ///< entries of one msgpack map or array
  std::uint32_t max_id_length = 128;          ///< characters of an id
  std::uint32_t max_depth = 64;               ///< nesting of maps and arrays (a client-side guard)
  std::uint64_t max_episodes_per_client = 10000;  ///< episodes one client may hold open

  /// These limits with every name `limits` (a welcome's `limits` map) carries replaced by its
  /// value; names it does not know are ignored, as section 7.1 asks.
  Limits updated_from(const Value& limits) const;
};

}  // namespace rlserve
