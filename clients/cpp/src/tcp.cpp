// TCP transport: a non-blocking connect bounded by a timeout, TCP_NODELAY, poll-bounded reads.
#include "tcp.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace rlserve {
namespace {

int milliseconds(double seconds) {
  if (seconds <= 0) return 0;
  if (seconds > 2.0e6) return 2000000000;
  return static_cast<int>(seconds * 1000.0) + 1;
}

Error lost(const std::string& what) { return make_error(ErrorCode::connection_lost, what); }

}  // namespace

TcpSocket::~TcpSocket() {
  if (fd_ >= 0) ::close(fd_);
}

Result<std::unique_ptr<TcpSocket>> TcpSocket::connect(const Address& address, double timeout_s) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(address.port);
  const std::string where = address.host + ":" + port;
  if (int rc = ::getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    return lost("cannot resolve " + where + ": " + gai_strerror(rc) + "; check the host name");
  }
  std::string failure = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int flags = ::fcntl(fd, F_GETFL, 0);
    ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      rc = ::poll(&p, 1, milliseconds(timeout_s));
      if (rc == 1) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        if (rc == 0) errno = ETIMEDOUT;
        rc = -1;
      }
    }
    if (rc == 0) {
      ::fcntl(fd, F_SETFL, flags);
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      ::freeaddrinfo(found);
      return std::unique_ptr<TcpSocket>(new TcpSocket(fd));
    }
    failure = std::strerror(errno);
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return lost("cannot connect to " + where + ": " + failure + "; is the server running there?");
}

Status TcpSocket::send_all(const std::uint8_t* data, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::send(fd_, data, size, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return lost(std::string("sending failed: ") + std::strerror(errno));
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
  return ok_status();
}

Status TcpSocket::wait_readable(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (;;) {
    const double left = std::chrono::duration<double>(deadline - std::chrono::steady_clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, milliseconds(left));
    if (rc > 0) return ok_status();
    if (rc == 0) return make_error(ErrorCode::timeout, "no reply within " + std::to_string(timeout_s) + " s");
    if (errno != EINTR) return lost(std::string("waiting for the server failed: ") + std::strerror(errno));
  }
}

Result<std::size_t> TcpSocket::receive(std::uint8_t* buffer, std::size_t capacity, double timeout_s) {
  if (auto s = wait_readable(timeout_s); !s) return s.error();
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer, capacity, 0);
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno == EINTR) continue;
    return lost(std::string("receiving failed: ") + std::strerror(errno));
  }
}

void TcpSocket::shutdown() noexcept { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace rlserve
