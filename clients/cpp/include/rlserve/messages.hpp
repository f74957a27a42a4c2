// Message envelopes and the typed replies a client reads (docs/protocol.md sections 7 and 8).
// Requests are built with make_message; their fields are the tables of section 7.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/limits.hpp"
#include "rlserve/value.hpp"

namespace rlserve {

/// Every message type of protocol version 1.
enum class MessageType {
  hello, welcome, start_episode, episode_started, get_action, action, log_action, log_returns,
  ok, end_episode, ping, pong, error, get_weights, weights, report_samples, samples_accepted,
  map_agents, agents_mapped, unknown,
};

/// The protocol version this library speaks.
constexpr int kProtocolVersion = 1;

/// The wire name of a type ("get_action").
const char* message_type_name(MessageType type) noexcept;
/// The type of a wire name; MessageType::unknown for a name of no version-1 message.
MessageType message_type_from_name(std::string_view name) noexcept;

/// The two fields every message has.
struct Envelope {
  MessageType type;
  std::string type_name;           ///< as sent (meaningful when type is unknown)
  std::optional<std::uint64_t> id; ///< absent or nil: std::nullopt
};

/// Reads `type` (a string) and `id` (an integer >= 0, or nil/absent); decode_error otherwise.
Result<Envelope> read_envelope(const Value& message);

/// A message map: `type`, `id`, then `fields` in their order. Fields whose value is nil are
/// left out (nil means absent, section 3.2).
Value make_message(MessageType type, std::uint64_t id, Value::Map fields);

/// An `error` reply (section 7.8).
struct ServerError {
  std::optional<std::uint64_t> id;  ///< nil when the server could not read the request's id
  std::string code;                 ///< section 8's code; unknown codes read as decode_error
  std::string message;
};
/// Reads an `error` message.
Result<ServerError> read_error(const Value& message);

/// A `welcome` reply (section 7.1).
struct Welcome {
  std::int64_t protocol_version = 0;
  std::string server_version;
  std::string instance_id;
  Value policies;                                          ///< policy id -> spaces map
  std::vector<std::pair<std::string, std::string>> mapping;
  bool multi_agent = false;
  bool map_agents = false;
  std::vector<std::string> inference_modes;
  Limits limits;  ///< the defaults updated with the server's `limits`
};
/// Reads a `welcome` message.
Result<Welcome> read_welcome(const Value& message);

/// A `weights` reply (section 7.9).
struct WeightsReply {
  std::string policy_id;
  std::uint64_t version = 0;
  bool unchanged = false;
  Value model;   ///< the `model` map; nil when unchanged
  Value arrays;  ///< the `arrays` map; nil when unchanged
};
/// Reads a `weights` message.
Result<WeightsReply> read_weights(const Value& message);

}  // namespace rlserve
