// Byte streams to a server: TCP (TCP_NODELAY), or TLS over it (OpenSSL), with timeouts.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rlserve/error.hpp"

namespace rlserve {

/// Where a server listens: `host:port` or `tls://host:port` (docs/protocol.md section 3.5).
struct Address {
  std::string host;
  std::uint16_t port = 0;
  bool tls = false;
  /// `host:port`, with `tls://` in front for TLS.
  std::string text() const;
};

/// Parses an address; invalid_argument naming the expected form.
Result<Address> parse_address(const std::string& text);
/// Parses one address or several separated by commas (the front-ends of one run, in the order
/// to try them); invalid_argument naming a bad or empty entry.
Result<std::vector<Address>> parse_addresses(const std::string& text);

/// One open connection's bytes. Not thread-safe: its owner serialises the calls.
class Transport {
 public:
  virtual ~Transport() = default;
  /// Writes every byte; connection_lost when the peer is gone.
  virtual Status send_all(const std::uint8_t* data, std::size_t size) = 0;
  /// Reads what is there (at most `capacity` bytes), waiting up to `timeout_s`: the count read,
  /// 0 when the peer closed, timeout when nothing came, connection_lost on a failure.
  virtual Result<std::size_t> receive(std::uint8_t* buffer, std::size_t capacity, double timeout_s) = 0;
  /// Shuts the connection down in both directions (a blocked receive returns).
  virtual void shutdown() noexcept = 0;
};

/// Opens a connection within `connect_timeout_s`: TCP with TCP_NODELAY, then the TLS handshake
/// for a tls:// address, the server's certificate verified against `ca_file` (PEM; empty: the
/// system's trust store) and its host name.
Result<std::unique_ptr<Transport>> dial(const Address& address, double connect_timeout_s,
                                        const std::string& ca_file);

/// Whether this build has TLS (OpenSSL was found at configure time).
bool tls_available() noexcept;

}  // namespace rlserve
