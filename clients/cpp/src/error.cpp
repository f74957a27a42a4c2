#include "rlserve/error.hpp"

#include <utility>

namespace rlserve {

const char* error_code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::decode_error: return "decode_error";
    case ErrorCode::limit_exceeded: return "limit_exceeded";
    case ErrorCode::frame_too_large: return "frame_too_large";
    case ErrorCode::bad_value: return "bad_value";
    case ErrorCode::unsupported_model: return "unsupported_model";
    case ErrorCode::invalid_argument: return "invalid_argument";
    case ErrorCode::internal: return "internal";
    case ErrorCode::connection_lost: return "connection_lost";
    case ErrorCode::timeout: return "timeout";
    case ErrorCode::unauthorized: return "unauthorized";
    case ErrorCode::version_mismatch: return "version_mismatch";
    case ErrorCode::episode_error: return "episode_error";
    case ErrorCode::episode_lost: return "episode_lost";
    case ErrorCode::capacity: return "capacity";
    case ErrorCode::unsupported_space: return "unsupported_space";
    case ErrorCode::forbidden: return "forbidden";
    case ErrorCode::server_internal: return "server_internal";
    case ErrorCode::tls_error: return "tls_error";
  }
  return "unknown";
}

ErrorCode error_code_from_server(const std::string& code) noexcept {
  static const std::pair<const char*, ErrorCode> table[] = {
      {"unauthorized", ErrorCode::unauthorized},     {"version_mismatch", ErrorCode::version_mismatch},
      {"episode_error", ErrorCode::episode_error},   {"capacity", ErrorCode::capacity},
      {"bad_value", ErrorCode::bad_value},           {"unsupported_space", ErrorCode::unsupported_space},
      {"decode_error", ErrorCode::decode_error},     {"limit_exceeded", ErrorCode::limit_exceeded},
      {"frame_too_large", ErrorCode::frame_too_large}, {"timeout", ErrorCode::timeout},
      {"forbidden", ErrorCode::forbidden},           {"internal", ErrorCode::server_internal},
  };
  for (const auto& [name, value] : table) {
    if (code == name) return value;
  }
  return ErrorCode::decode_error;
}

}  // namespace rlserve
