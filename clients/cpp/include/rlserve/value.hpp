// A decoded msgpack value: what one frame body holds (docs/protocol.md sections 3.2 and 5).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "rlserve/ndarray.hpp"

namespace rlserve {

/// msgpack `bin` bytes, kept apart from strings.
struct Binary {
  std::vector<std::uint8_t> bytes;
  bool operator==(const Binary& o) const { return bytes == o.bytes; }
};

/// One msgpack value. Maps keep their keys' order (the encoder writes them in that order) and
/// have string keys only (section 3.2). Integers are int64 unless above INT64_MAX (then uint64).
/// Reals remember whether they were `float 32` or `float 64`.
class Value {
 public:
  using Array = std::vector<Value>;
  using Map = std::vector<std::pair<std::string, Value>>;

  /// What a Value holds.
  enum class Kind { nil, boolean, integer, uinteger, float32, float64, string, binary, array, map, ndarray };

  Value() = default;
  Value(std::nullptr_t) {}                                                 // NOLINT
  Value(bool b) : v_(b) {}                                                 // NOLINT
  Value(int i) : v_(static_cast<std::int64_t>(i)) {}                       // NOLINT
  Value(std::int64_t i) : v_(i) {}                                         // NOLINT
  Value(std::uint64_t u);                                                  // NOLINT
  Value(float f) : v_(f) {}                                                // NOLINT
  Value(double d) : v_(d) {}                                               // NOLINT
  Value(const char* s) : v_(std::string(s)) {}                             // NOLINT
  Value(std::string s) : v_(std::move(s)) {}                               // NOLINT
  Value(Binary b) : v_(std::move(b)) {}                                    // NOLINT
  Value(Array a) : v_(std::move(a)) {}                                     // NOLINT
  Value(Map m) : v_(std::move(m)) {}                                       // NOLINT
  Value(NDArray a) : v_(std::move(a)) {}                                   // NOLINT

  Kind kind() const noexcept { return static_cast<Kind>(v_.index()); }
  bool is_nil() const noexcept { return kind() == Kind::nil; }

  /// The boolean, if this is one (never from an integer: section 3.2).
  std::optional<bool> as_bool() const noexcept;
  /// The integer, if this is one that fits int64 (never from a boolean or a real).
  std::optional<std::int64_t> as_int() const noexcept;
  /// The integer, if this is a non-negative one.
  std::optional<std::uint64_t> as_uint() const noexcept;
  /// The number, if this is an integer or a real ("wherever a real is expected an integer is
  /// accepted too").
  std::optional<double> as_number() const noexcept;
  const std::string* as_string() const noexcept { return std::get_if<std::string>(&v_); }
  const Binary* as_binary() const noexcept { return std::get_if<Binary>(&v_); }
  const Array* as_array() const noexcept { return std::get_if<Array>(&v_); }
  Array* as_array() noexcept { return std::get_if<Array>(&v_); }
  const Map* as_map() const noexcept { return std::get_if<Map>(&v_); }
  Map* as_map() noexcept { return std::get_if<Map>(&v_); }
  const NDArray* as_ndarray() const noexcept { return std::get_if<NDArray>(&v_); }

  /// The entry of a map under `key`, or nullptr (also when this is not a map). A nil entry is
  /// returned as nil: callers treat nil as absent where section 3.2 says so (present()).
  const Value* find(std::string_view key) const noexcept;
  /// The entry under `key` unless it is absent or nil.
  const Value* present(std::string_view key) const noexcept;

  /// Deep equality; reals and arrays compare by bits, so NaN equals the same NaN.
  bool operator==(const Value& other) const noexcept;
  bool operator!=(const Value& other) const noexcept { return !(*this == other); }

 private:
  std::variant<std::monostate, bool, std::int64_t, std::uint64_t, float, double, std::string,
               Binary, Array, Map, NDArray>
      v_;
};

/// Strings (ids, say) as one array Value.
inline Value string_array(const std::vector<std::string>& items) { return Value(Value::Array(items.begin(), items.end())); }

}  // namespace rlserve
