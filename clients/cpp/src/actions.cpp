// Actions out of replies; observation batches into requests.
#include "actions.hpp"

#include <algorithm>
#include <string>

namespace rlserve {
namespace {

void numbers(const Value& v, std::vector<double>& out) {
  if (const auto* a = v.as_ndarray()) {
    for (std::size_t i = 0; i < a->size(); ++i) out.push_back(a->get_double(i));
  } else if (const auto* list = v.as_array()) {
    for (const Value& item : *list) numbers(item, out);
  } else if (const auto* map = v.as_map()) {
    std::vector<const std::pair<std::string, Value>*> sorted;
    for (const auto& entry : *map) sorted.push_back(&entry);
    std::sort(sorted.begin(), sorted.end(), [](auto* x, auto* y) { return x->first < y->first; });
    for (const auto* entry : sorted) numbers(entry->second, out);
  } else if (const auto b = v.as_bool()) {
    out.push_back(*b ? 1.0 : 0.0);
  } else if (const auto x = v.as_number()) {
    out.push_back(*x);
  }
}

}  // namespace

ServerAction action_of(const Value& action) {
  ServerAction a{action, {}};
  numbers(action, a.values);
  return a;
}

Result<std::vector<ServerAction>> actions_of(const Value& actions, std::size_t count) {
  std::vector<ServerAction> out;
  if (const auto* list = actions.as_array()) {
    if (list->size() != count) {
      return make_error(ErrorCode::decode_error, "the server answered " + std::to_string(list->size()) +
                                                     " actions for " + std::to_string(count) + " episodes");
    }
    for (const Value& item : *list) out.push_back(action_of(item));
    return out;
  }
  const auto* array = actions.as_ndarray();
  if (array == nullptr || array->shape().empty() || array->shape()[0] != count) {
    return make_error(ErrorCode::decode_error, "the server's 'actions' is not one action per episode");
  }
  const std::vector<std::uint32_t> row_shape(array->shape().begin() + 1, array->shape().end());
  const std::size_t row = count ? array->size() / count : 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (row_shape.empty()) {  // Discrete: integers
      out.push_back(action_of(dtype_is_float(array->dtype()) ? Value(array->get_double(i)) : Value(array->get_int64(i))));
      continue;
    }
    NDArray item(array->dtype(), row_shape);
    for (std::size_t k = 0; k < row; ++k) item.set_double(k, array->get_double(i * row + k));
    out.push_back(action_of(Value(std::move(item))));
  }
  return out;
}

Result<Value> stack_observations(const Space& space, const std::vector<Value>& observations) {
  if (space.type != Space::Type::box) return Value(Value::Array(observations.begin(), observations.end()));
  std::vector<std::uint32_t> shape{static_cast<std::uint32_t>(observations.size())};
  shape.insert(shape.end(), space.shape.begin(), space.shape.end());
  NDArray stacked(space.dtype, shape);
  const std::size_t each = space.elements();
  for (std::size_t i = 0; i < observations.size(); ++i) {
    std::vector<double> values;
    numbers(observations[i], values);
    if (values.size() != each) {
      return make_error(ErrorCode::bad_value, "observations[" + std::to_string(i) + "]: " + std::to_string(values.size()) +
                                                  " numbers do not fit " + space.describe());
    }
    for (std::size_t k = 0; k < each; ++k) stacked.set_double(i * each + k, values[k]);
  }
  return Value(std::move(stacked));
}

}  // namespace rlserve
