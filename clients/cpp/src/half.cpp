// IEEE 754 binary16 conversions (the wire's float16 dtype).
#include <cstdint>
#include <cstring>

#include "rlserve/ndarray.hpp"

namespace rlserve {

float half_to_float(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  std::uint32_t exponent = (bits >> 10) & 0x1fu;
  std::uint32_t mantissa = bits & 0x3ffu;
  std::uint32_t out;
  if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);  // infinity or NaN (payload kept)
  } else if (exponent != 0) {
    out = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;
  } else {  // subnormal: normalise
    exponent = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --exponent;
    }
    out = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &out, sizeof f);
  return f;
}

std::uint16_t float_to_half(float value) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &value, sizeof x);
  const auto sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  const std::uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // infinity or NaN
    const std::uint32_t mant = abs & 0x7fffffu;
    return static_cast<std::uint16_t>(sign | 0x7c00u | (mant ? (0x200u | (mant >> 13)) : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // subnormal half or zero
    if (abs < 0x33000000u) return sign;  // below half the smallest subnormal
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
    return static_cast<std::uint16_t>(sign | half);
  }
  std::uint32_t half = ((abs >> 13) - (112u << 10));
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<std::uint16_t>(sign | half);
}

}  // namespace rlserve
