// The TLS transport (private to the library): OpenSSL over a connected TcpSocket.
#pragma once

#include <memory>
#include <string>

#include "tcp.hpp"

namespace rlserve {

/// Runs the TLS handshake over `tcp` within `timeout_s`, verifying the server's certificate
/// against `ca_file` (empty: the system's trust store) and `host`; tls_error naming the fix
/// when it fails, or when this build has no OpenSSL.
Result<std::unique_ptr<Transport>> tls_handshake(std::unique_ptr<TcpSocket> tcp, const std::string& host,
                                                 const std::string& ca_file, double timeout_s);

}  // namespace rlserve
