#include "vectors.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>

namespace vectors {

Json load(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return Json::parse(ss.str());
}

std::vector<std::uint8_t> from_hex(const std::string& hex) {
  std::vector<std::uint8_t> out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<std::uint8_t>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

namespace {

double real(const Json& j) {
  if (j.is_string()) {
    const auto s = j.get<std::string>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    std::fprintf(stderr, "unknown real %s\n", s.c_str());
    std::exit(2);
  }
  return j.get<double>();
}

rlserve::Value ndarray(const Json& t) {
  const auto dtype = rlserve::dtype_from_name(t.at("dtype").get<std::string>());
  if (!dtype) {
    std::fprintf(stderr, "unknown dtype\n");
    std::exit(2);
  }
  std::vector<std::uint32_t> shape;
  for (const auto& d : t.at("shape")) shape.push_back(d.get<std::uint32_t>());
  rlserve::NDArray a(*dtype, shape);
  const Json& data = t.at("data");
  for (std::size_t i = 0; i < data.size(); ++i) {
    const Json& e = data[i];
    if (e.is_boolean()) a.set_int64(i, e.get<bool>() ? 1 : 0);
    else if (e.is_number_unsigned()) a.set_uint64(i, e.get<std::uint64_t>());
    else if (e.is_number_integer()) a.set_int64(i, e.get<std::int64_t>());
    else a.set_double(i, real(e));
  }
  return a;
}

}  // namespace

rlserve::Value from_tagged(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null: return rlserve::Value();
    case Json::value_t::boolean: return rlserve::Value(j.get<bool>());
    case Json::value_t::number_unsigned: return rlserve::Value(j.get<std::uint64_t>());
    case Json::value_t::number_integer: return rlserve::Value(j.get<std::int64_t>());
    case Json::value_t::number_float: return rlserve::Value(j.get<double>());
    case Json::value_t::string: return rlserve::Value(j.get<std::string>());
    case Json::value_t::array: {
      rlserve::Value::Array items;
      for (const auto& e : j) items.push_back(from_tagged(e));
      return items;
    }
    case Json::value_t::object: {
      if (j.size() == 1 && j.contains("$ndarray")) return ndarray(j.at("$ndarray"));
      if (j.size() == 1 && j.contains("$float")) return rlserve::Value(real(j.at("$float")));
      rlserve::Value::Map m;
      for (const auto& [k, v] : j.items()) m.emplace_back(k, from_tagged(v));
      return m;
    }
    default:
      std::fprintf(stderr, "unexpected JSON value\n");
      std::exit(2);
  }
}

std::vector<double> numbers(const Json& j) {
  std::vector<double> out;
  for (const auto& e : j) out.push_back(e.is_null() ? std::numeric_limits<double>::quiet_NaN() : real(e));
  return out;
}

}  // namespace vectors
