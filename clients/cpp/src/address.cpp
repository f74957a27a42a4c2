// Server addresses: `host:port` and `tls://host:port`.
#include <cstdlib>

#include "rlserve/transport.hpp"

namespace rlserve {

std::string Address::text() const {
  return (tls ? "tls://" : "") + host + ":" + std::to_string(port);
}

Result<Address> parse_address(const std::string& text) {
  Address a;
  std::string rest = text;
  const std::string scheme = "tls://";
  if (rest.rfind(scheme, 0) == 0) {
    a.tls = true;
    rest = rest.substr(scheme.size());
  } else if (rest.rfind("tcp://", 0) == 0) {
    rest = rest.substr(6);
  }
  const auto colon = rest.rfind(':');
  const auto bad = [&text] {
    return make_error(ErrorCode::invalid_argument,
                      "address '" + text + "' is not host:port or tls://host:port (e.g. 127.0.0.1:9900)");
  };
  if (colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) return bad();
  a.host = rest.substr(0, colon);
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']') a.host = a.host.substr(1, a.host.size() - 2);
  const std::string port = rest.substr(colon + 1);
  char* end = nullptr;
  const long n = std::strtol(port.c_str(), &end, 10);
  if (end == nullptr || *end != '\0' || n <= 0 || n > 65535) return bad();
  a.port = static_cast<std::uint16_t>(n);
  return a;
}

Result<std::vector<Address>> parse_addresses(const std::string& text) {
  std::vector<Address> out;
  std::size_t begin = 0;
  for (;;) {
    const std::size_t comma = text.find(',', begin);
    std::string part = text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin);
    const auto first = part.find_first_not_of(" \t");
    part = first == std::string::npos ? std::string() : part.substr(first, part.find_last_not_of(" \t") - first + 1);
    if (part.empty()) {
      return make_error(ErrorCode::invalid_argument, "the server addresses '" + text + "' hold an empty entry; give one or "
                                                     "more host:port addresses separated by commas");
    }
    auto a = parse_address(part);
    if (!a) {
      if (comma == std::string::npos && out.empty()) return a.error();
      return make_error(ErrorCode::invalid_argument, "front-end address '" + part + "' of '" + text + "': " + a.error().message);
    }
    out.push_back(std::move(*a));
    if (comma == std::string::npos) return out;
    begin = comma + 1;
  }
}

}  // namespace rlserve
