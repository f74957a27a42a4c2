// The ndarray extension value (docs/protocol.md section 5.3): dtype, shape and little-endian data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/limits.hpp"

namespace rlserve {

/// Element types, numbered as the wire's dtype codes.
enum class DType : std::uint8_t {
  boolean = 0, int8 = 1, uint8 = 2, int16 = 3, uint16 = 4, int32 = 5, uint32 = 6,
  int64 = 7, uint64 = 8, float16 = 9, float32 = 10, float64 = 11,
};

/// Bytes per element.
std::size_t dtype_size(DType dtype) noexcept;
/// The numpy name ("float32", "bool", ...).
const char* dtype_name(DType dtype) noexcept;
/// The dtype of a numpy name, if it is one of the twelve.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;
/// Whether the dtype holds reals (float16/32/64).
bool dtype_is_float(DType dtype) noexcept;

/// An n-dimensional array as the wire carries it: elements row-major, stored little-endian.
class NDArray {
 public:
  /// A zero-filled array; shape [] is a 0-dimensional array of one element.
  NDArray(DType dtype, std::vector<std::uint32_t> shape);
  /// A float32 array holding `values` (count = product of shape).
  static NDArray from_floats(const float* values, std::vector<std::uint32_t> shape);

  /// Parses an extension payload, checking in the order of section 5.3 (decode_error for a
  /// malformed payload, limit_exceeded for too many dimensions or elements).
  static Result<NDArray> from_payload(const std::uint8_t* data, std::size_t size,
                                      const Limits& limits);
  /// The extension payload (dtype, ndim, dims, data).
  std::vector<std::uint8_t> payload() const;

  DType dtype() const noexcept { return dtype_; }
  const std::vector<std::uint32_t>& shape() const noexcept { return shape_; }
  /// Number of elements.
  std::size_t size() const noexcept { return count_; }
  /// The raw little-endian element bytes.
  const std::vector<std::uint8_t>& bytes() const noexcept { return data_; }

  /// Element i as a double (integers converted, float16 widened).
  double get_double(std::size_t i) const noexcept;
  /// Element i as a signed integer (integer and bool dtypes; reals truncated).
  std::int64_t get_int64(std::size_t i) const noexcept;
  /// Element i as an unsigned integer (uint64 elements above INT64_MAX need this).
  std::uint64_t get_uint64(std::size_t i) const noexcept;
  /// Sets element i from a double, converted to the dtype (float16 rounds to nearest even).
  void set_double(std::size_t i, double v) noexcept;
  /// Sets element i from a signed integer, converted to the dtype.
  void set_int64(std::size_t i, std::int64_t v) noexcept;
  /// Sets element i from an unsigned integer, converted to the dtype.
  void set_uint64(std::size_t i, std::uint64_t v) noexcept;
  /// All elements as float32 (what the network reads).
  std::vector<float> to_floats() const;

  /// Same dtype, shape and element bytes (so NaN equals NaN with the same bits).
  bool operator==(const NDArray& other) const noexcept;
  bool operator!=(const NDArray& other) const noexcept { return !(*this == other); }

 private:
  NDArray() = default;
  DType dtype_ = DType::float32;
  std::vector<std::uint32_t> shape_;
  std::size_t count_ = 1;
  std::vector<std::uint8_t> data_;
};

/// IEEE binary16 bits to float.
float half_to_float(std::uint16_t bits) noexcept;
/// float to IEEE binary16 bits, rounding to nearest even.
std::uint16_t float_to_half(float value) noexcept;

}  // namespace rlserve
