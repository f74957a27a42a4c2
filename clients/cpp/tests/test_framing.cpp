// Frames split at every byte, several frames in one read, and the frame limit.
#include <cstdio>

#include "check.hpp"
#include "rlserve/codec.hpp"
#include "rlserve/framing.hpp"
#include "rlserve/messages.hpp"

using rlserve::ErrorCode;

int main() {
  const rlserve::Value ping = rlserve::make_message(rlserve::MessageType::ping, 8, {});
  const rlserve::Value start = rlserve::make_message(rlserve::MessageType::start_episode, 2,
                                                     {{"episode_id", "ep-1"}, {"training_enabled", true}});
  auto f1 = rlserve::encode_frame(ping, {});
  auto f2 = rlserve::encode_frame(start, {});
  CHECK(f1.ok() && f2.ok(), "encode_frame");
  if (!f1.ok() || !f2.ok()) return check::finish("test_framing");
  CHECK(f1->size() == 19 && (*f1)[0] == 0 && (*f1)[3] == 15, "the prefix is the body length, big-endian");
  std::vector<std::uint8_t> stream = *f1;
  stream.insert(stream.end(), f2->begin(), f2->end());

  // Fed one byte at a time, or all at once: the same two bodies.
  for (std::size_t chunk : {std::size_t{1}, std::size_t{3}, stream.size()}) {
    rlserve::FrameReader reader;
    std::vector<rlserve::Value> got;
    for (std::size_t i = 0; i < stream.size(); i += chunk) {
      reader.feed(stream.data() + i, std::min(chunk, stream.size() - i));
      for (;;) {
        auto next = reader.next();
        CHECK(next.ok(), "next");
        if (!next.ok() || !next->has_value()) break;
        auto v = rlserve::decode_body((*next)->data(), (*next)->size(), {});
        CHECK(v.ok(), "decode a reassembled body");
        if (v.ok()) got.push_back(*v);
      }
    }
    CHECK(got.size() == 2 && got[0] == ping && got[1] == start,
          "two frames come back whole with chunks of " + std::to_string(chunk));
    CHECK(reader.buffered() == 0, "nothing left over");
  }

  // A prefix over the limit is refused before the body arrives, and the stream stays refused.
  rlserve::FrameReader small(16);
  const std::uint8_t big[4] = {0, 0, 0, 17};
  small.feed(big, 4);
  auto r = small.next();
  CHECK(!r.ok() && r.error().code == ErrorCode::frame_too_large, "a 17-byte frame over a 16-byte limit");
  small.feed(f1->data(), f1->size());
  auto again = small.next();
  CHECK(!again.ok() && again.error().code == ErrorCode::frame_too_large, "the stream cannot be resynchronised");
  rlserve::Limits tiny;
  tiny.max_frame_bytes = 10;
  auto too_big = rlserve::encode_frame(start, tiny);
  CHECK(!too_big.ok() && too_big.error().code == ErrorCode::frame_too_large, "encode_frame checks the limit");
  return check::finish("test_framing");
}
