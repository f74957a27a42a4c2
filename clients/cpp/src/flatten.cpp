// flatten: a value checked against its space (section 6.3) and flattened (section 14.3).
#include <cmath>
#include <limits>
#include <sstream>

#include "rlserve/spaces.hpp"

namespace rlserve {
namespace {

Error bad_value(const std::string& message) { return make_error(ErrorCode::bad_value, message); }

std::string number_text(double v) {
  std::ostringstream s;
  s.precision(9);
  s << v;
  return s.str();
}

std::string index_text(std::size_t flat, const std::vector<std::uint32_t>& shape) {
  if (shape.empty()) return "";
  std::vector<std::size_t> idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = shape[k] ? flat % shape[k] : 0;
    flat = shape[k] ? flat / shape[k] : 0;
  }
  std::string s = " at index (";
  for (std::size_t k = 0; k < idx.size(); ++k) s += std::to_string(idx[k]) + (idx.size() == 1 ? "," : (k + 1 < idx.size() ? ", " : ""));
  return s + ")";
}

/// The elements of an array-like value of `shape`, row-major; `real` is set when any element
/// was sent as a real (a float array or a float number).
struct Elements {
  std::vector<double> values;
  bool real = false;
};

Status nested(const Value& v, const std::vector<std::uint32_t>& shape, std::size_t depth, Elements& out,
              std::vector<std::uint32_t>& got_shape) {
  if (depth == shape.size()) {
    if (v.kind() == Value::Kind::float32 || v.kind() == Value::Kind::float64) out.real = true;
    if (const auto b = v.as_bool()) {
      out.values.push_back(*b ? 1.0 : 0.0);
      return ok_status();
    }
    const auto x = v.as_number();
    if (!x) return bad_value("");
    out.values.push_back(*x);
    return ok_status();
  }
  const auto* list = v.as_array();
  if (list == nullptr || list->size() != shape[depth]) {
    got_shape.resize(depth);
    if (list) got_shape.push_back(static_cast<std::uint32_t>(list->size()));
    return bad_value("");
  }
  for (const Value& item : *list) {
    if (auto s = nested(item, shape, depth + 1, out, got_shape); !s) return s;
  }
  return ok_status();
}

Result<Elements> elements(const Space& space, const Value& v, const std::string& where) {
  Elements out;
  if (const NDArray* a = v.as_ndarray()) {
    if (a->shape() != space.shape) {
      return bad_value(where + ": shape " + shape_text(a->shape()) + " does not fit " + space.describe() +
                       "; expected shape " + shape_text(space.shape));
    }
    out.real = dtype_is_float(a->dtype());
    out.values.reserve(a->size());
    for (std::size_t i = 0; i < a->size(); ++i) out.values.push_back(a->get_double(i));
    return out;
  }
  std::vector<std::uint32_t> got;
  if (!nested(v, space.shape, 0, out, got)) {
    return bad_value(where + ": the value does not fit " + space.describe() +
                     "; expected shape " + shape_text(space.shape) + " (an array or nested lists of numbers)");
  }
  return out;
}

Status box(const Space& s, const Value& v, const std::string& where, std::vector<float>& out) {
  auto e = elements(s, v, where);
  if (!e) return e.error();
  const bool float_space = dtype_is_float(s.dtype);
  if (e->real && !float_space) {
    return bad_value(where + ": real numbers sent for " + s.describe() + "; send integers of its dtype");
  }
  for (std::size_t i = 0; i < e->values.size(); ++i) {
    const double v64 = e->values[i];
    const auto v32 = static_cast<float>(v64);
    if (!std::isfinite(v64) || !std::isfinite(v32)) {
      return bad_value(where + ": value " + number_text(v64) + index_text(i, s.shape) +
                       " is not a finite float32 number; send finite values (-3.4028235e+38..3.4028235e+38)");
    }
    if (std::isfinite(s.low[i]) && v32 < s.low[i]) {
      return bad_value(where + ": value " + number_text(v64) + index_text(i, s.shape) +
                       " is below the space's low bound " + number_text(s.low[i]) + "; clip it or widen the space");
    }
    if (std::isfinite(s.high[i]) && v32 > s.high[i]) {
      return bad_value(where + ": value " + number_text(v64) + index_text(i, s.shape) +
                       " is above the space's high bound " + number_text(s.high[i]) + "; clip it or widen the space");
    }
    out.push_back(v32);
  }
  return ok_status();
}

Status flatten_into(const Space& s, const Value& v, std::vector<float>& out, const std::string& where) {
  switch (s.type) {
    case Space::Type::box: return box(s, v, where, out);
    case Space::Type::discrete: {
      const auto x = v.as_int();
      if (!x) return bad_value(where + ": " + s.describe() + " takes an integer (not a boolean or a real)");
      if (*x < s.start || *x >= s.start + s.n) {
        return bad_value(where + ": " + std::to_string(*x) + " is outside " + s.describe() + "; valid values are " +
                         std::to_string(s.start) + ".." + std::to_string(s.start + s.n - 1));
      }
      for (std::int64_t k = 0; k < s.n; ++k) out.push_back(k == *x - s.start ? 1.0f : 0.0f);
      return ok_status();
    }
    case Space::Type::multi_discrete:
    case Space::Type::multi_binary: {
      auto e = elements(s, v, where);
      if (!e) return e.error();
      if (e->real) return bad_value(where + ": real numbers sent for " + s.describe() + "; send integers");
      for (std::size_t i = 0; i < e->values.size(); ++i) {
        const double x = e->values[i];
        if (s.type == Space::Type::multi_binary) {
          if (x != 0.0 && x != 1.0) return bad_value(where + ": value " + number_text(x) + index_text(i, s.shape) + " of " + s.describe() + " is not 0 or 1");
          out.push_back(static_cast<float>(x));
          continue;
        }
        const double lo = static_cast<double>(s.starts[i]), n = static_cast<double>(s.nvec[i]);
        if (x < lo || x >= lo + n) {
          return bad_value(where + ": value " + number_text(x) + index_text(i, s.shape) + " is outside " + s.describe() +
                           "'s range " + number_text(lo) + ".." + number_text(lo + n - 1));
        }
        for (std::int64_t k = 0; k < s.nvec[i]; ++k) out.push_back(static_cast<double>(k) == x - lo ? 1.0f : 0.0f);
      }
      return ok_status();
    }
    case Space::Type::dict: {
      const auto* m = v.as_map();
      if (m == nullptr) return bad_value(where + ": a Dict space takes a map");
      for (const auto& [key, item] : *m) {
        bool known = false;
        for (const auto& e : s.entries) known = known || e.first == key;
        if (!known) return bad_value(where + ": key '" + key + "' is not in the Dict space");
      }
      for (const auto& [key, sub] : s.entries) {
        const Value* item = v.find(key);
        if (item == nullptr) return bad_value(where + ": key '" + key + "' is missing");
        if (auto r = flatten_into(sub, *item, out, where + "['" + key + "']"); !r) return r;
      }
      return ok_status();
    }
    case Space::Type::tuple: {
      const auto* list = v.as_array();
      if (list == nullptr || list->size() != s.entries.size()) {
        return bad_value(where + ": a Tuple of " + std::to_string(s.entries.size()) + " spaces takes a list of as many values");
      }
      for (std::size_t i = 0; i < list->size(); ++i) {
        if (auto r = flatten_into(s.entries[i].second, (*list)[i], out, where + "[" + std::to_string(i) + "]"); !r) return r;
      }
      return ok_status();
    }
  }
  return bad_value(where + ": unknown space");
}

}  // namespace

Status flatten(const Space& space, const Value& value, std::vector<float>& out, const std::string& where) {
  std::vector<float> flat;
  flat.reserve(space.flat_dim());
  if (auto r = flatten_into(space, value, flat, where); !r) return r;
  out.insert(out.end(), flat.begin(), flat.end());
  return ok_status();
}

}  // namespace rlserve
