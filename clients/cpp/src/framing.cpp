#include "rlserve/framing.hpp"

#include <string>

#include "rlserve/codec.hpp"

namespace rlserve {
namespace {

Error too_large(std::uint64_t length, std::uint64_t limit) {
  return make_error(ErrorCode::frame_too_large,
                    "frame of " + std::to_string(length) + " bytes is over max_frame_bytes (" +
                        std::to_string(limit) + "); send smaller messages (split batches)");
}

}  // namespace

Result<std::vector<std::uint8_t>> frame_body(const std::vector<std::uint8_t>& body,
                                             std::uint64_t max_frame_bytes) {
  if (body.size() > max_frame_bytes || body.size() > 0xffffffffu) {
    return too_large(body.size(), max_frame_bytes);
  }
  std::vector<std::uint8_t> out(4 + body.size());
  const auto n = static_cast<std::uint32_t>(body.size());
  out[0] = static_cast<std::uint8_t>(n >> 24);
  out[1] = static_cast<std::uint8_t>(n >> 16);
  out[2] = static_cast<std::uint8_t>(n >> 8);
  out[3] = static_cast<std::uint8_t>(n);
  std::copy(body.begin(), body.end(), out.begin() + 4);
  return out;
}

Result<std::vector<std::uint8_t>> encode_frame(const Value& message, const Limits& limits) {
  return frame_body(encode(message), limits.max_frame_bytes);
}

void FrameReader::feed(const std::uint8_t* data, std::size_t size) {
  if (broken_ || size == 0) return;
  if (start_ > 0 && start_ == buffer_.size()) {
    buffer_.clear();
    start_ = 0;
  }
  buffer_.insert(buffer_.end(), data, data + size);
}

Result<std::optional<std::vector<std::uint8_t>>> FrameReader::next() {
  if (broken_) return too_large(broken_length_, max_frame_bytes_);
  if (buffered() < 4) return std::optional<std::vector<std::uint8_t>>();
  const std::uint8_t* p = buffer_.data() + start_;
  const std::uint64_t length = (static_cast<std::uint64_t>(p[0]) << 24) |
                               (static_cast<std::uint64_t>(p[1]) << 16) |
                               (static_cast<std::uint64_t>(p[2]) << 8) | p[3];
  if (length > max_frame_bytes_) {  // checked on the prefix, before the body arrives
    broken_ = true;
    broken_length_ = length;
    buffer_.clear();
    start_ = 0;
    return too_large(length, max_frame_bytes_);
  }
  if (buffered() < 4 + length) return std::optional<std::vector<std::uint8_t>>();
  std::vector<std::uint8_t> body(p + 4, p + 4 + length);
  start_ += 4 + static_cast<std::size_t>(length);
  if (start_ > 65536 && start_ * 2 > buffer_.size()) {  // compact now and then
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(start_));
    start_ = 0;
  }
  return std::optional<std::vector<std::uint8_t>>(std::move(body));
}

}  // namespace rlserve
