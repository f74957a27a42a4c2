// Errors as values: every fallible call returns a Result, never throws across the library's API.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace rlserve {

/// Why a call failed. The first codes are the protocol's own (docs/protocol.md section 8), for
/// failures the wire defines; the last ones are the library's.
enum class ErrorCode : int {
  decode_error = 1,       ///< bytes that are not a valid message (not msgpack, wrong field type, ...)
  limit_exceeded = 2,     ///< a container, array or id over a declared limit (section 10)
  frame_too_large = 3,    ///< a frame's length prefix over max_frame_bytes (section 3.1)
  bad_value = 4,          ///< a value that does not fit (observation length, no legal action, ...)
  unsupported_model = 5,  ///< a model description this library does not implement
  invalid_argument = 6,   ///< a caller's mistake (null pointer, wrong buffer size)
  internal = 7,           ///< a bug in this library
  // The network client's: a connection that broke, and the server's error codes (section 8).
  connection_lost = 8,    ///< the server could not be reached, or not again within the reconnect timeout
  timeout = 9,            ///< no reply in time (or the server's `timeout`)
  unauthorized = 10,      ///< a wrong or missing token
  version_mismatch = 11,  ///< the server speaks another protocol version or inference mode
  episode_error = 12,     ///< an unknown, ended or another client's episode; a call out of order
  episode_lost = 13,      ///< the server restarted since the episode started: start a new one
  capacity = 14,          ///< too many open episodes (or connections)
  unsupported_space = 15, ///< a space the server cannot carry
  forbidden = 16,         ///< refused by the server's origin or host rules
  server_internal = 17,   ///< the server failed because of its own fault
  tls_error = 18,         ///< a TLS handshake or certificate failure
};

/// The protocol-style name of a code, e.g. "decode_error".
const char* error_code_name(ErrorCode code) noexcept;

/// The ErrorCode of a server `error` reply's `code` (section 8); an unknown code reads as
/// decode_error.
ErrorCode error_code_from_server(const std::string& code) noexcept;

/// A failure: its code and a message that names the fix.
struct Error {
  ErrorCode code;
  std::string message;
};

/// Whether `e` is a broken or silent connection (connection_lost, timeout): a call that is safe to
/// repeat may succeed on a new connection.
inline bool is_connection_failure(const Error& e) noexcept {
  return e.code == ErrorCode::connection_lost || e.code == ErrorCode::timeout;
}

/// Either a value or an Error.
template <class T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}   // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  /// Whether it holds a value.
  bool ok() const noexcept { return v_.index() == 0; }
  explicit operator bool() const noexcept { return ok(); }
  /// The value; only when ok().
  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return std::get<0>(v_); }
  const T& operator*() const& { return std::get<0>(v_); }
  T* operator->() { return &std::get<0>(v_); }
  const T* operator->() const { return &std::get<0>(v_); }
  /// The error; only when !ok().
  const Error& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, Error> v_;
};

/// A Result without a value.
using Status = Result<std::monostate>;

/// The successful Status.
inline Status ok_status() { return Status(std::monostate{}); }

/// Shorthand for building an Error.
inline Error make_error(ErrorCode code, std::string message) {
  return Error{code, std::move(message)};
}

}  // namespace rlserve
