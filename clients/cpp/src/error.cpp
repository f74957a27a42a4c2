#include "rlserve/error.hpp"

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
  }
  return "unknown";
}

}  // namespace rlserve
