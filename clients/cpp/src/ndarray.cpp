#include "rlserve/ndarray.hpp"

#include <cstring>
#include <string>

namespace rlserve {
namespace {

struct DTypeInfo {
  const char* name;
  std::size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {"bool", 1},   {"int8", 1},   {"uint8", 1},  {"int16", 2},  {"uint16", 2},   {"int32", 4},
    {"uint32", 4}, {"int64", 8},  {"uint64", 8}, {"float16", 2}, {"float32", 4}, {"float64", 8},
};

std::uint64_t load_le(const std::uint8_t* p, std::size_t n) noexcept {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return v;
}

void store_le(std::uint8_t* p, std::size_t n, std::uint64_t v) noexcept {
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

template <class To, class From>
To bit_cast(From from) noexcept {
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

}  // namespace

std::size_t dtype_size(DType dtype) noexcept { return kDTypes[static_cast<int>(dtype)].size; }
const char* dtype_name(DType dtype) noexcept { return kDTypes[static_cast<int>(dtype)].name; }

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (int i = 0; i < 12; ++i) {
    if (name == kDTypes[i].name) return static_cast<DType>(i);
  }
  return std::nullopt;
}

bool dtype_is_float(DType dtype) noexcept {
  return dtype == DType::float16 || dtype == DType::float32 || dtype == DType::float64;
}

NDArray::NDArray(DType dtype, std::vector<std::uint32_t> shape)
    : dtype_(dtype), shape_(std::move(shape)) {
  count_ = 1;
  for (auto d : shape_) count_ *= d;
  data_.assign(count_ * dtype_size(dtype_), 0);
}

NDArray NDArray::from_floats(const float* values, std::vector<std::uint32_t> shape) {
  NDArray a(DType::float32, std::move(shape));
  for (std::size_t i = 0; i < a.count_; ++i) a.set_double(i, values[i]);
  return a;
}

Result<NDArray> NDArray::from_payload(const std::uint8_t* data, std::size_t size,
                                      const Limits& limits) {
  if (size < 2) {
    return make_error(ErrorCode::decode_error,
                      "ndarray payload of " + std::to_string(size) +
                          " bytes is shorter than its 2-byte header (protocol section 5.3)");
  }
  if (data[0] > 11) {
    return make_error(ErrorCode::decode_error, "ndarray dtype code " + std::to_string(data[0]) +
                                                   " is unknown; valid codes are 0..11");
  }
  const std::uint32_t ndim = data[1];
  if (ndim > limits.max_array_ndim) {
    return make_error(ErrorCode::limit_exceeded,
                      "ndarray has " + std::to_string(ndim) + " dimensions; the limit is " +
                          std::to_string(limits.max_array_ndim));
  }
  if (size < 2 + 4 * static_cast<std::size_t>(ndim)) {
    return make_error(ErrorCode::decode_error, "ndarray payload ends inside its dimensions");
  }
  NDArray a;
  a.dtype_ = static_cast<DType>(data[0]);
  // Saturating product: 8 dims of up to 2^32-1 would overflow 64 bits.
  std::uint64_t count = 1;
  bool zero = false;
  for (std::uint32_t k = 0; k < ndim; ++k) {
    const auto d = static_cast<std::uint32_t>(load_le(data + 2 + 4 * k, 4));
    a.shape_.push_back(d);
    if (d == 0) zero = true;
    if (d != 0) count = count > UINT64_MAX / d ? UINT64_MAX : count * d;
  }
  if (zero) count = 0;
  if (count > limits.max_array_elements) {
    return make_error(ErrorCode::limit_exceeded,
                      "ndarray has more elements than the limit of " +
                          std::to_string(limits.max_array_elements) +
                          "; send smaller arrays or raise max_array_elements");
  }
  const std::size_t elem = dtype_size(a.dtype_);
  const std::size_t header = 2 + 4 * static_cast<std::size_t>(ndim);
  const std::size_t expected = header + static_cast<std::size_t>(count) * elem;
  if (size != expected) {
    return make_error(ErrorCode::decode_error,
                      "ndarray payload is " + std::to_string(size) + " bytes; its dtype and shape need " +
                          std::to_string(expected));
  }
  a.count_ = static_cast<std::size_t>(count);
  a.data_.assign(data + header, data + size);
  return a;
}

std::vector<std::uint8_t> NDArray::payload() const {
  std::vector<std::uint8_t> out(2 + 4 * shape_.size());
  out[0] = static_cast<std::uint8_t>(dtype_);
  out[1] = static_cast<std::uint8_t>(shape_.size());
  for (std::size_t k = 0; k < shape_.size(); ++k) store_le(out.data() + 2 + 4 * k, 4, shape_[k]);
  out.insert(out.end(), data_.begin(), data_.end());
  return out;
}

double NDArray::get_double(std::size_t i) const noexcept {
  const std::size_t n = dtype_size(dtype_);
  const std::uint64_t raw = load_le(data_.data() + i * n, n);
  switch (dtype_) {
    case DType::boolean: return raw != 0 ? 1.0 : 0.0;
    case DType::int8: return static_cast<std::int8_t>(raw);
    case DType::uint8: return static_cast<double>(raw);
    case DType::int16: return static_cast<std::int16_t>(raw);
    case DType::uint16: return static_cast<double>(raw);
    case DType::int32: return static_cast<std::int32_t>(raw);
    case DType::uint32: return static_cast<double>(raw);
    case DType::int64: return static_cast<double>(static_cast<std::int64_t>(raw));
    case DType::uint64: return static_cast<double>(raw);
    case DType::float16: return half_to_float(static_cast<std::uint16_t>(raw));
    case DType::float32: return bit_cast<float>(static_cast<std::uint32_t>(raw));
    case DType::float64: return bit_cast<double>(raw);
  }
  return 0.0;
}

std::int64_t NDArray::get_int64(std::size_t i) const noexcept {
  if (dtype_is_float(dtype_)) return static_cast<std::int64_t>(get_double(i));
  const std::size_t n = dtype_size(dtype_);
  const std::uint64_t raw = load_le(data_.data() + i * n, n);
  switch (dtype_) {
    case DType::int8: return static_cast<std::int8_t>(raw);
    case DType::int16: return static_cast<std::int16_t>(raw);
    case DType::int32: return static_cast<std::int32_t>(raw);
    case DType::boolean: return raw != 0;
    default: return static_cast<std::int64_t>(raw);
  }
}

std::uint64_t NDArray::get_uint64(std::size_t i) const noexcept {
  if (dtype_ == DType::uint64) return load_le(data_.data() + i * 8, 8);
  return static_cast<std::uint64_t>(get_int64(i));
}

void NDArray::set_double(std::size_t i, double v) noexcept {
  const std::size_t n = dtype_size(dtype_);
  std::uint8_t* p = data_.data() + i * n;
  switch (dtype_) {
    case DType::float16: store_le(p, 2, float_to_half(static_cast<float>(v))); return;
    case DType::float32: store_le(p, 4, bit_cast<std::uint32_t>(static_cast<float>(v))); return;
    case DType::float64: store_le(p, 8, bit_cast<std::uint64_t>(v)); return;
    case DType::boolean: store_le(p, 1, v != 0.0 ? 1 : 0); return;
    case DType::uint64: store_le(p, 8, static_cast<std::uint64_t>(v)); return;
    default: set_int64(i, static_cast<std::int64_t>(v)); return;
  }
}

void NDArray::set_int64(std::size_t i, std::int64_t v) noexcept {
  if (dtype_is_float(dtype_)) {
    set_double(i, static_cast<double>(v));
    return;
  }
  const std::size_t n = dtype_size(dtype_);
  store_le(data_.data() + i * n, n,
           dtype_ == DType::boolean ? (v != 0 ? 1u : 0u) : static_cast<std::uint64_t>(v));
}

void NDArray::set_uint64(std::size_t i, std::uint64_t v) noexcept {
  if (dtype_is_float(dtype_)) {
    set_double(i, static_cast<double>(v));
    return;
  }
  const std::size_t n = dtype_size(dtype_);
  store_le(data_.data() + i * n, n, dtype_ == DType::boolean ? (v != 0 ? 1u : 0u) : v);
}

std::vector<float> NDArray::to_floats() const {
  std::vector<float> out(count_);
  for (std::size_t i = 0; i < count_; ++i) out[i] = static_cast<float>(get_double(i));
  return out;
}

bool NDArray::operator==(const NDArray& other) const noexcept {
  return dtype_ == other.dtype_ && shape_ == other.shape_ && data_ == other.data_;
}

}  // namespace rlserve
