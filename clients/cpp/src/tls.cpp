// TLS over TCP with OpenSSL (TLS 1.2 or later, the peer's certificate and host name verified).
#include "tls.hpp"

#ifdef RLSERVE_WITH_TLS
#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <sys/socket.h>
#include <sys/time.h>
#endif

namespace rlserve {

#ifndef RLSERVE_WITH_TLS

Result<std::unique_ptr<Transport>> tls_handshake(std::unique_ptr<TcpSocket>, const std::string&,
                                                 const std::string&, double) {
  return make_error(ErrorCode::tls_error,
                    "this build of rlserve has no TLS: install OpenSSL's headers (Debian: libssl-dev) "
                    "and configure the library again");
}

bool tls_available() noexcept { return false; }

#else

namespace {

std::string openssl_errors() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail" : out;
}

class TlsSocket final : public Transport {
 public:
  TlsSocket(std::unique_ptr<TcpSocket> tcp, SSL_CTX* ctx, SSL* ssl) : tcp_(std::move(tcp)), ctx_(ctx), ssl_(ssl) {}
  ~TlsSocket() override {
    SSL_free(ssl_);
    SSL_CTX_free(ctx_);
  }
  TlsSocket(const TlsSocket&) = delete;
  TlsSocket& operator=(const TlsSocket&) = delete;

  Status send_all(const std::uint8_t* data, std::size_t size) override {
    while (size > 0) {
      const int chunk = static_cast<int>(size > (1u << 30) ? (1u << 30) : size);
      const int n = SSL_write(ssl_, data, chunk);
      if (n <= 0) {
        return make_error(ErrorCode::connection_lost, "sending over TLS failed: " + openssl_errors());
      }
      data += n;
      size -= static_cast<std::size_t>(n);
    }
    return ok_status();
  }

  Result<std::size_t> receive(std::uint8_t* buffer, std::size_t capacity, double timeout_s) override {
    const int cap = static_cast<int>(capacity > (1u << 30) ? (1u << 30) : capacity);
    for (;;) {  // a TLS record may need several TCP reads (or none, when bytes are pending)
      if (SSL_pending(ssl_) == 0) {
        if (auto s = tcp_->wait_readable(timeout_s); !s) return s.error();
      }
      const int n = SSL_read(ssl_, buffer, cap);
      if (n > 0) return static_cast<std::size_t>(n);
      const int err = SSL_get_error(ssl_, n);
      if (err == SSL_ERROR_ZERO_RETURN || (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0)) return std::size_t{0};
      if (err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) {
        return make_error(ErrorCode::connection_lost, "receiving over TLS failed: " + openssl_errors());
      }
    }
  }

  void shutdown() noexcept override { tcp_->shutdown(); }

 private:
  std::unique_ptr<TcpSocket> tcp_;
  SSL_CTX* ctx_;
  SSL* ssl_;
};

}  // namespace

bool tls_available() noexcept { return true; }

Result<std::unique_ptr<Transport>> tls_handshake(std::unique_ptr<TcpSocket> tcp, const std::string& host,
                                                 const std::string& ca_file, double timeout_s) {
  const auto fail = [](const std::string& what) { return make_error(ErrorCode::tls_error, what); };
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) return fail("cannot set up TLS: " + openssl_errors());
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  const int loaded = ca_file.empty() ? SSL_CTX_set_default_verify_paths(ctx)
                                     : SSL_CTX_load_verify_locations(ctx, ca_file.c_str(), nullptr);
  if (loaded != 1) {
    SSL_CTX_free(ctx);
    return fail("cannot read the CA file '" + ca_file + "' (" + openssl_errors() +
                "); pass the PEM file of the CA that signed the server's certificate");
  }
  SSL* ssl = SSL_new(ctx);
  const int fd = tcp->fd();
  auto tls = std::make_unique<TlsSocket>(std::move(tcp), ctx, ssl);
  in6_addr ip6{};
  in_addr ip4{};
  const bool is_ip = inet_pton(AF_INET, host.c_str(), &ip4) == 1 || inet_pton(AF_INET6, host.c_str(), &ip6) == 1;
  X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
  if (is_ip) {
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, host.c_str());
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  }
  // The socket stays blocking: the handshake is bounded by socket timeouts, lifted afterwards
  // (later reads wait in poll first).
  SSL_set_fd(ssl, fd);
  timeval limit{static_cast<time_t>(timeout_s), static_cast<suseconds_t>((timeout_s - static_cast<double>(static_cast<time_t>(timeout_s))) * 1e6)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  const int connected = SSL_connect(ssl);
  timeval none{0, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof none);
  if (connected != 1) {
    const long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK) {
      return fail(std::string("the server's certificate was not accepted: ") + X509_verify_cert_error_string(verify) +
                  "; pass the CA file that signed it (tls_ca) and connect by the name or address it was made for");
    }
    return fail("the TLS handshake with " + host + " failed (" + openssl_errors() +
                "); is the server started with --tls-cert/--tls-key?");
  }
  return std::unique_ptr<Transport>(std::move(tls));
}

#endif

}  // namespace rlserve
