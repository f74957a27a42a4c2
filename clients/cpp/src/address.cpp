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

}  // namespace rlserve
