// Length-prefixed frames (docs/protocol.md section 3.1): a u32 big-endian body length, then the body.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/limits.hpp"
#include "rlserve/value.hpp"

namespace rlserve {

/// The 4-byte prefix and the body, ready to write; frame_too_large when the body is over
/// `max_frame_bytes` (the server would close the connection).
Result<std::vector<std::uint8_t>> frame_body(const std::vector<std::uint8_t>& body,
                                             std::uint64_t max_frame_bytes);

/// Encodes a message and frames it.
Result<std::vector<std::uint8_t>> encode_frame(const Value& message, const Limits& limits);

/// Reassembles frames from bytes as they arrive (a read may hold part of a frame or several).
/// Once it has reported frame_too_large the stream cannot be resynchronised: every later call
/// reports it again, and the connection must be closed.
class FrameReader {
 public:
  explicit FrameReader(std::uint64_t max_frame_bytes = Limits{}.max_frame_bytes)
      : max_frame_bytes_(max_frame_bytes) {}

  /// Changes the limit (e.g. to welcome.limits.max_frame_bytes); applies to the next prefix.
  void set_max_frame_bytes(std::uint64_t n) noexcept { max_frame_bytes_ = n; }
  /// Appends received bytes.
  void feed(const std::uint8_t* data, std::size_t size);
  /// The next whole body, std::nullopt when more bytes are needed, or frame_too_large.
  Result<std::optional<std::vector<std::uint8_t>>> next();
  /// Bytes received but not yet returned as a frame.
  std::size_t buffered() const noexcept { return buffer_.size() - start_; }

 private:
  std::uint64_t max_frame_bytes_;
  std::vector<std::uint8_t> buffer_;
  std::size_t start_ = 0;
  bool broken_ = false;
  std::uint64_t broken_length_ = 0;
};

}  // namespace rlserve
