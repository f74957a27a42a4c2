// The TCP transport (private to the library).
#pragma once

#include <memory>

#include "rlserve/transport.hpp"

namespace rlserve {

/// A connected TCP socket with TCP_NODELAY.
class TcpSocket final : public Transport {
 public:
  /// Connects within `timeout_s`; connection_lost naming the address on failure.
  static Result<std::unique_ptr<TcpSocket>> connect(const Address& address, double timeout_s);
  ~TcpSocket() override;
  TcpSocket(const TcpSocket&) = delete;
  TcpSocket& operator=(const TcpSocket&) = delete;

  Status send_all(const std::uint8_t* data, std::size_t size) override;
  Result<std::size_t> receive(std::uint8_t* buffer, std::size_t capacity, double timeout_s) override;
  void shutdown() noexcept override;
  /// Waits until bytes (or the peer's close) can be read: timeout when none came in time.
  Status wait_readable(double timeout_s);
  /// The descriptor (for TLS to read and write through).
  int fd() const noexcept { return fd_; }

 private:
  explicit TcpSocket(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace rlserve
