// Uses the installed C++ headers and library.
#include <cstdio>

#include "rlserve/codec.hpp"
#include "rlserve/messages.hpp"

int main() {
  const auto ping = rlserve::make_message(rlserve::MessageType::ping, 8, {});
  const auto bytes = rlserve::encode(ping);
  auto back = rlserve::decode_body(bytes.data(), bytes.size(), {});
  if (!back.ok() || !(*back == ping)) return 1;
  std::printf("consumer_cpp: a ping of %zu bytes round-trips\n", bytes.size());
  return 0;
}
