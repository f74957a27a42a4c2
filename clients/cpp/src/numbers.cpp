// Plain numbers to values of a space.
#include "numbers.hpp"

#include <cmath>

namespace rlserve {
namespace {

Value build(const Space& space, const double*& next) {
  switch (space.type) {
    case Space::Type::discrete:
      return Value(static_cast<std::int64_t>(std::llround(*next++)));
    case Space::Type::box:
    case Space::Type::multi_discrete:
    case Space::Type::multi_binary: {
      NDArray array(space.type == Space::Type::multi_binary ? DType::int8 : space.dtype, space.shape);
      for (std::size_t i = 0; i < array.size(); ++i) {
        const double v = *next++;
        if (space.type == Space::Type::box && dtype_is_float(space.dtype)) {
          array.set_double(i, v);
        } else {
          array.set_int64(i, static_cast<std::int64_t>(std::llround(v)));
        }
      }
      return Value(std::move(array));
    }
    case Space::Type::dict: {
      Value::Map map;
      for (const auto& [key, sub] : space.entries) map.emplace_back(key, build(sub, next));
      return Value(std::move(map));
    }
    case Space::Type::tuple: {
      Value::Array list;
      for (const auto& entry : space.entries) list.push_back(build(entry.second, next));
      return Value(std::move(list));
    }
  }
  return Value();
}

}  // namespace

std::size_t number_count(const Space& space) noexcept {
  switch (space.type) {
    case Space::Type::discrete:
      return 1;
    case Space::Type::box:
    case Space::Type::multi_discrete:
    case Space::Type::multi_binary:
      return space.elements();
    case Space::Type::dict:
    case Space::Type::tuple: {
      std::size_t n = 0;
      for (const auto& entry : space.entries) n += number_count(entry.second);
      return n;
    }
  }
  return 0;
}

Result<Value> value_from_numbers(const Space& space, const std::vector<double>& numbers, const std::string& what) {
  const std::size_t want = number_count(space);
  if (numbers.size() != want) {
    return make_error(ErrorCode::bad_value, what + ": " + std::to_string(numbers.size()) + " numbers do not fit " +
                                                space.describe() + "; expected " + std::to_string(want) +
                                                (space.type == Space::Type::box ? " (shape " + shape_text(space.shape) + ")"
                                                                                : std::string()));
  }
  const double* next = numbers.data();
  return build(space, next);
}

}  // namespace rlserve
