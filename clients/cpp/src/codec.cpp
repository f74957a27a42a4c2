#include "rlserve/codec.hpp"

#include <msgpack.hpp>

#include <cstring>
#include <string>

namespace rlserve {
namespace {

bool valid_utf8(const char* s, std::size_t n) noexcept {
  const auto* p = reinterpret_cast<const unsigned char*>(s);
  std::size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    std::size_t len;
    std::uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2;
      cp = c & 0x1fu;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3;
      cp = c & 0x0fu;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4;
      cp = c & 0x07u;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (std::size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3fu);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xd800 && cp <= 0xdfff) || cp > 0x10ffff) {
      return false;
    }
    i += len;
  }
  return true;
}

Result<Value> convert(const msgpack::object& o, const Limits& limits) {
  switch (o.type) {
    case msgpack::type::NIL: return Value();
    case msgpack::type::BOOLEAN: return Value(o.via.boolean);
    case msgpack::type::POSITIVE_INTEGER: return Value(static_cast<std::uint64_t>(o.via.u64));
    case msgpack::type::NEGATIVE_INTEGER: return Value(static_cast<std::int64_t>(o.via.i64));
    case msgpack::type::FLOAT32: return Value(static_cast<float>(o.via.f64));
    case msgpack::type::FLOAT64: return Value(o.via.f64);
    case msgpack::type::STR:
      if (!valid_utf8(o.via.str.ptr, o.via.str.size)) {
        return make_error(ErrorCode::decode_error, "a msgpack str is not valid UTF-8");
      }
      return Value(std::string(o.via.str.ptr, o.via.str.size));
    case msgpack::type::BIN: {
      const auto* p = reinterpret_cast<const std::uint8_t*>(o.via.bin.ptr);
      return Value(Binary{std::vector<std::uint8_t>(p, p + o.via.bin.size)});
    }
    case msgpack::type::EXT: {
      if (o.via.ext.type() != 1) {
        return make_error(ErrorCode::decode_error,
                          "msgpack extension type " + std::to_string(o.via.ext.type()) +
                              " is not allowed; the only extension type is 1 (ndarray)");
      }
      auto a = NDArray::from_payload(reinterpret_cast<const std::uint8_t*>(o.via.ext.data()),
                                     o.via.ext.size, limits);
      if (!a) return a.error();
      return Value(std::move(a).value());
    }
    case msgpack::type::ARRAY: {
      Value::Array items;
      items.reserve(o.via.array.size);
      for (std::uint32_t i = 0; i < o.via.array.size; ++i) {
        auto item = convert(o.via.array.ptr[i], limits);
        if (!item) return item.error();
        items.push_back(std::move(item).value());
      }
      return Value(std::move(items));
    }
    case msgpack::type::MAP: {
      Value::Map entries;
      entries.reserve(o.via.map.size);
      for (std::uint32_t i = 0; i < o.via.map.size; ++i) {
        const auto& kv = o.via.map.ptr[i];
        if (kv.key.type != msgpack::type::STR) {
          return make_error(ErrorCode::decode_error, "map keys must be msgpack str values");
        }
        auto key = convert(kv.key, limits);
        if (!key) return key.error();
        auto val = convert(kv.val, limits);
        if (!val) return val.error();
        entries.emplace_back(*key->as_string(), std::move(val).value());
      }
      return Value(std::move(entries));
    }
  }
  return make_error(ErrorCode::decode_error, "unknown msgpack value type");
}

void pack_value(msgpack::packer<msgpack::sbuffer>& pk, msgpack::sbuffer& stream, const Value& v) {
  switch (v.kind()) {
    case Value::Kind::nil: pk.pack_nil(); return;
    case Value::Kind::boolean:
      if (*v.as_bool()) pk.pack_true(); else pk.pack_false();
      return;
    case Value::Kind::integer: pk.pack_int64(*v.as_int()); return;
    case Value::Kind::uinteger: pk.pack_uint64(*v.as_uint()); return;
    // Reals are written by hand: msgpack-cxx's pack_double/pack_float write integral reals
    // as integers (1.0 as 01, -0.0 as 00), which is not the server's form.
    case Value::Kind::float32: {
      const auto f = static_cast<float>(*v.as_number());
      std::uint32_t bits;
      std::memcpy(&bits, &f, sizeof bits);
      char buf[5] = {static_cast<char>(0xca)};
      for (int i = 0; i < 4; ++i) buf[1 + i] = static_cast<char>(bits >> (24 - 8 * i));
      stream.write(buf, sizeof buf);
      return;
    }
    case Value::Kind::float64: {
      const double d = *v.as_number();
      std::uint64_t bits;
      std::memcpy(&bits, &d, sizeof bits);
      char buf[9] = {static_cast<char>(0xcb)};
      for (int i = 0; i < 8; ++i) buf[1 + i] = static_cast<char>(bits >> (56 - 8 * i));
      stream.write(buf, sizeof buf);
      return;
    }
    case Value::Kind::string: {
      const std::string& s = *v.as_string();
      pk.pack_str(static_cast<std::uint32_t>(s.size()));
      pk.pack_str_body(s.data(), static_cast<std::uint32_t>(s.size()));
      return;
    }
    case Value::Kind::binary: {
      const auto& b = v.as_binary()->bytes;
      pk.pack_bin(static_cast<std::uint32_t>(b.size()));
      pk.pack_bin_body(reinterpret_cast<const char*>(b.data()), static_cast<std::uint32_t>(b.size()));
      return;
    }
    case Value::Kind::array: {
      const auto& a = *v.as_array();
      pk.pack_array(static_cast<std::uint32_t>(a.size()));
      for (const auto& item : a) pack_value(pk, stream, item);
      return;
    }
    case Value::Kind::map: {
      const auto& m = *v.as_map();
      pk.pack_map(static_cast<std::uint32_t>(m.size()));
      for (const auto& [k, item] : m) {
        pk.pack_str(static_cast<std::uint32_t>(k.size()));
        pk.pack_str_body(k.data(), static_cast<std::uint32_t>(k.size()));
        pack_value(pk, stream, item);
      }
      return;
    }
    case Value::Kind::ndarray: {
      const auto payload = v.as_ndarray()->payload();
      pk.pack_ext(payload.size(), 1);
      pk.pack_ext_body(reinterpret_cast<const char*>(payload.data()),
                       static_cast<std::uint32_t>(payload.size()));
      return;
    }
  }
}

}  // namespace

Result<Value> decode_body(const std::uint8_t* data, std::size_t size, const Limits& limits) {
  if (size == 0) {
    return make_error(ErrorCode::decode_error, "empty frame body; a body is one msgpack map");
  }
  const std::size_t ext_limit = static_cast<std::size_t>(limits.max_frame_bytes);
  const msgpack::unpack_limit limit(limits.max_container_len, limits.max_container_len,
                                    ext_limit, ext_limit, ext_limit, limits.max_depth);
  try {
    std::size_t offset = 0;
    msgpack::object_handle handle =
        msgpack::unpack(reinterpret_cast<const char*>(data), size, offset,
                        [](msgpack::type::object_type, std::size_t, void*) { return true; },
                        nullptr, limit);
    if (offset != size) {
      return make_error(ErrorCode::decode_error,
                        std::to_string(size - offset) +
                            " bytes left over after the msgpack value; a body is exactly one map");
    }
    const msgpack::object& root = handle.get();
    if (root.type != msgpack::type::MAP) {
      return make_error(ErrorCode::decode_error, "the frame body is not a msgpack map");
    }
    return convert(root, limits);
  } catch (const msgpack::depth_size_overflow&) {
    return make_error(ErrorCode::limit_exceeded,
                      "msgpack values nest deeper than " + std::to_string(limits.max_depth) + " levels");
  } catch (const msgpack::size_overflow&) {
    return make_error(ErrorCode::limit_exceeded,
                      "a msgpack map or array has more than max_container_len (" +
                          std::to_string(limits.max_container_len) + ") entries");
  } catch (const msgpack::insufficient_bytes&) {
    return make_error(ErrorCode::decode_error, "the frame body ends inside a msgpack value");
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::limit_exceeded, "the frame body needs more memory than is available");
  } catch (const std::exception& e) {
    return make_error(ErrorCode::decode_error, std::string("not a valid msgpack message: ") + e.what());
  }
}

std::vector<std::uint8_t> encode(const Value& value) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pack_value(pk, buffer, value);
  const auto* p = reinterpret_cast<const std::uint8_t*>(buffer.data());
  return std::vector<std::uint8_t>(p, p + buffer.size());
}

}  // namespace rlserve
