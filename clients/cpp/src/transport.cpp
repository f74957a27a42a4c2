// dial: TCP, then TLS for a tls:// address.
#include "rlserve/transport.hpp"

#include "tcp.hpp"
#include "tls.hpp"

namespace rlserve {

Result<std::unique_ptr<Transport>> dial(const Address& address, double connect_timeout_s,
                                        const std::string& ca_file) {
  auto tcp = TcpSocket::connect(address, connect_timeout_s);
  if (!tcp) return tcp.error();
  if (!address.tls) return std::unique_ptr<Transport>(std::move(*tcp));
  return tls_handshake(std::move(*tcp), address.host, ca_file, connect_timeout_s);
}

}  // namespace rlserve
