// parse_space: descriptions of section 6.2.
#include <algorithm>
#include <cmath>
#include <limits>

#include "rlserve/spaces.hpp"

namespace rlserve {
namespace {

constexpr int kMaxDepth = 8;
constexpr std::uint64_t kMaxElements = 4000000;

Error bad(const std::string& message) { return make_error(ErrorCode::decode_error, "space description: " + message); }

std::uint64_t product(const std::vector<std::uint32_t>& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n = (d != 0 && n > kMaxElements) ? n : n * d;
  return n;
}

Result<std::vector<std::uint32_t>> read_shape(const Value* v, const char* field) {
  std::vector<std::uint32_t> shape;
  if (v == nullptr || v->as_array() == nullptr) return bad(std::string("'") + field + "' is not a list of integers");
  for (const Value& d : *v->as_array()) {
    const auto n = d.as_uint();
    if (!n || *n > 0xffffffffu) return bad(std::string("'") + field + "' holds something that is not an integer >= 0");
    shape.push_back(static_cast<std::uint32_t>(*n));
  }
  if (shape.size() > 8) return make_error(ErrorCode::limit_exceeded, "space description: more than 8 dimensions");
  if (product(shape) > kMaxElements) return make_error(ErrorCode::limit_exceeded, "space description: over 4,000,000 elements");
  return shape;
}

/// A bound: one number or null for every element, or a flat list with one entry each.
Status read_bound(const Value* v, std::size_t count, double unbounded, std::vector<double>& out) {
  out.assign(count, unbounded);
  if (v == nullptr || v->is_nil()) return ok_status();
  if (const auto x = v->as_number()) {
    std::fill(out.begin(), out.end(), *x);
    return ok_status();
  }
  const auto* list = v->as_array();
  if (list == nullptr || list->size() != count) return bad("a Box bound is not a number, null or a list of one entry per element");
  for (std::size_t i = 0; i < count; ++i) {
    if ((*list)[i].is_nil()) continue;
    const auto x = (*list)[i].as_number();
    if (!x) return bad("a Box bound holds something that is not a number or null");
    out[i] = *x;
  }
  return ok_status();
}

/// A (nested) list of integers: its shape and its elements row-major.
Status read_nested_ints(const Value& v, std::vector<std::uint32_t>& shape, std::vector<std::int64_t>& out,
                        std::size_t depth) {
  if (const auto x = v.as_int()) {
    if (depth != shape.size()) return bad("'nvec' is not rectangular");
    out.push_back(*x);
    return ok_status();
  }
  const auto* list = v.as_array();
  if (list == nullptr || depth >= 8) return bad("'nvec'/'start' is not a nested list of integers");
  if (depth == shape.size()) shape.push_back(static_cast<std::uint32_t>(list->size()));
  else if (shape[depth] != list->size()) return bad("'nvec' is not rectangular");
  for (const Value& item : *list) {
    if (auto s = read_nested_ints(item, shape, out, depth + 1); !s) return s;
  }
  return ok_status();
}

Result<Space> parse(const Value& d, int depth) {
  if (depth > kMaxDepth) return make_error(ErrorCode::limit_exceeded, "space description: Dict/Tuple nest deeper than 8 levels");
  if (d.as_map() == nullptr) return bad("not a map");
  const Value* type = d.present("type");
  if (type == nullptr || type->as_string() == nullptr) return bad("no string 'type'");
  const std::string& t = *type->as_string();
  Space s;
  if (t == "Box") {
    s.type = Space::Type::box;
    auto shape = read_shape(d.present("shape"), "shape");
    if (!shape) return shape.error();
    s.shape = std::move(shape).value();
    if (const Value* dt = d.present("dtype")) {
      const auto parsed = dt->as_string() ? dtype_from_name(*dt->as_string()) : std::nullopt;
      if (!parsed) return bad("Box 'dtype' is not a numpy dtype name");
      s.dtype = *parsed;
    }
    const double inf = std::numeric_limits<double>::infinity();
    if (auto r = read_bound(d.present("low"), s.elements(), -inf, s.low); !r) return r.error();
    if (auto r = read_bound(d.present("high"), s.elements(), inf, s.high); !r) return r.error();
  } else if (t == "Discrete") {
    s.type = Space::Type::discrete;
    const Value* n = d.present("n");
    if (n == nullptr || !n->as_int() || *n->as_int() < 1) return bad("Discrete 'n' is not an integer >= 1");
    s.n = *n->as_int();
    if (const Value* st = d.present("start")) {
      if (!st->as_int()) return bad("Discrete 'start' is not an integer");
      s.start = *st->as_int();
    }
  } else if (t == "MultiDiscrete") {
    s.type = Space::Type::multi_discrete;
    s.dtype = DType::int64;
    const Value* nvec = d.present("nvec");
    if (nvec == nullptr) return bad("MultiDiscrete has no 'nvec'");
    if (auto r = read_nested_ints(*nvec, s.shape, s.nvec, 0); !r) return r.error();
    if (s.nvec.size() > kMaxElements) return make_error(ErrorCode::limit_exceeded, "space description: over 4,000,000 elements");
    for (auto k : s.nvec) {
      if (k < 1) return bad("MultiDiscrete 'nvec' entries must be >= 1");
    }
    s.starts.assign(s.nvec.size(), 0);
    if (const Value* st = d.present("start")) {
      std::vector<std::uint32_t> shape;
      std::vector<std::int64_t> starts;
      if (auto r = read_nested_ints(*st, shape, starts, 0); !r) return r.error();
      if (shape != s.shape) return bad("MultiDiscrete 'start' has another shape than 'nvec'");
      s.starts = std::move(starts);
    }
    if (const Value* dt = d.present("dtype")) {
      const auto parsed = dt->as_string() ? dtype_from_name(*dt->as_string()) : std::nullopt;
      if (!parsed || dtype_is_float(*parsed) || *parsed == DType::boolean) return bad("MultiDiscrete 'dtype' is not an integer dtype");
      s.dtype = *parsed;
    }
  } else if (t == "MultiBinary") {
    s.type = Space::Type::multi_binary;
    s.dtype = DType::int8;
    const Value* n = d.present("n");
    if (n != nullptr && n->as_uint()) {
      if (*n->as_uint() > kMaxElements) return make_error(ErrorCode::limit_exceeded, "space description: over 4,000,000 elements");
      s.shape = {static_cast<std::uint32_t>(*n->as_uint())};
    } else {
      auto shape = read_shape(n, "n");
      if (!shape) return shape.error();
      s.shape = std::move(shape).value();
    }
  } else if (t == "Dict" || t == "Tuple") {
    s.type = t == "Dict" ? Space::Type::dict : Space::Type::tuple;
    const Value* spaces = d.present("spaces");
    if (s.type == Space::Type::dict) {
      if (spaces == nullptr || spaces->as_map() == nullptr) return bad("Dict 'spaces' is not a map");
      for (const auto& [key, sub] : *spaces->as_map()) {
        auto parsed = parse(sub, depth + 1);
        if (!parsed) return parsed.error();
        s.entries.emplace_back(key, std::move(parsed).value());
      }
      // Flattening reads the keys sorted by code point; UTF-8 byte order is that order.
      std::sort(s.entries.begin(), s.entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      for (std::size_t i = 1; i < s.entries.size(); ++i) {
        if (s.entries[i].first == s.entries[i - 1].first) return bad("Dict key '" + s.entries[i].first + "' appears twice");
      }
    } else {
      if (spaces == nullptr || spaces->as_array() == nullptr) return bad("Tuple 'spaces' is not a list");
      for (const Value& sub : *spaces->as_array()) {
        auto parsed = parse(sub, depth + 1);
        if (!parsed) return parsed.error();
        s.entries.emplace_back(std::string(), std::move(parsed).value());
      }
    }
  } else {
    return make_error(ErrorCode::decode_error, "space description: unknown space type '" + t +
                                                   "'; the protocol has Box, Discrete, MultiDiscrete, MultiBinary, Dict, Tuple");
  }
  return s;
}

}  // namespace

std::string shape_text(const std::vector<std::uint32_t>& shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (shape.size() == 1) s += ",";
    else if (i + 1 < shape.size()) s += ", ";
  }
  return s + ")";
}

std::size_t Space::elements() const noexcept {
  std::size_t count = 1;
  for (auto d : shape) count *= d;
  return count;
}

std::size_t Space::flat_dim() const noexcept {
  switch (type) {
    case Type::box:
    case Type::multi_binary: return elements();
    case Type::discrete: return static_cast<std::size_t>(n);
    case Type::multi_discrete: {
      std::size_t total = 0;
      for (auto k : nvec) total += static_cast<std::size_t>(k);
      return total;
    }
    case Type::dict:
    case Type::tuple: {
      std::size_t total = 0;
      for (const auto& e : entries) total += e.second.flat_dim();
      return total;
    }
  }
  return 0;
}

std::string Space::describe() const {
  switch (type) {
    case Type::box: return "Box(" + shape_text(shape) + ", " + dtype_name(dtype) + ")";
    case Type::discrete: return "Discrete(" + std::to_string(n) + ", start=" + std::to_string(start) + ")";
    case Type::multi_discrete: return "MultiDiscrete" + shape_text(shape);
    case Type::multi_binary: return "MultiBinary" + shape_text(shape);
    case Type::dict: return "Dict(" + std::to_string(entries.size()) + " keys)";
    case Type::tuple: return "Tuple(" + std::to_string(entries.size()) + " items)";
  }
  return "space";
}

Result<Space> parse_space(const Value& description) { return parse(description, 0); }

}  // namespace rlserve
