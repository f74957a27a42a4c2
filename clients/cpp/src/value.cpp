#include "rlserve/value.hpp"

#include <cstring>
#include <limits>

namespace rlserve {

Value::Value(std::uint64_t u) {
  if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    v_ = static_cast<std::int64_t>(u);
  } else {
    v_ = u;
  }
}

std::optional<bool> Value::as_bool() const noexcept {
  if (const bool* b = std::get_if<bool>(&v_)) return *b;
  return std::nullopt;
}

std::optional<std::int64_t> Value::as_int() const noexcept {
  if (const auto* i = std::get_if<std::int64_t>(&v_)) return *i;
  return std::nullopt;
}

std::optional<std::uint64_t> Value::as_uint() const noexcept {
  if (const auto* i = std::get_if<std::int64_t>(&v_)) {
    if (*i >= 0) return static_cast<std::uint64_t>(*i);
    return std::nullopt;
  }
  if (const auto* u = std::get_if<std::uint64_t>(&v_)) return *u;
  return std::nullopt;
}

std::optional<double> Value::as_number() const noexcept {
  switch (kind()) {
    case Kind::integer: return static_cast<double>(std::get<std::int64_t>(v_));
    case Kind::uinteger: return static_cast<double>(std::get<std::uint64_t>(v_));
    case Kind::float32: return std::get<float>(v_);
    case Kind::float64: return std::get<double>(v_);
    default: return std::nullopt;
  }
}

const Value* Value::find(std::string_view key) const noexcept {
  const Map* m = as_map();
  if (m == nullptr) return nullptr;
  for (const auto& [k, v] : *m) {
    if (k == key) return &v;
  }
  return nullptr;
}

const Value* Value::present(std::string_view key) const noexcept {
  const Value* v = find(key);
  return (v == nullptr || v->is_nil()) ? nullptr : v;
}

bool Value::operator==(const Value& other) const noexcept {
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::float32: {
      const float a = std::get<float>(v_), b = std::get<float>(other.v_);
      return std::memcmp(&a, &b, sizeof a) == 0;
    }
    case Kind::float64: {
      const double a = std::get<double>(v_), b = std::get<double>(other.v_);
      return std::memcmp(&a, &b, sizeof a) == 0;
    }
    default: return v_ == other.v_;
  }
}

}  // namespace rlserve
