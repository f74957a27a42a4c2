#include "server_process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace e2e {

ServerProcess::ServerProcess(const std::string& bin_dir, const std::vector<std::string>& args,
                             const std::vector<std::string>& env, const std::string& log_path, double timeout_s)
    : log_path_(log_path) {
  std::vector<std::string> argv_s{bin_dir + "/rlserve", "serve"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<std::string> env_s;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string item = *e;
    if (item.rfind("RLSERVE_TOKEN=", 0) == 0 || item.rfind("RLSERVE_TLS_CA=", 0) == 0) continue;
    env_s.push_back(item);
  }
  env_s.insert(env_s.end(), {"PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1"});
  env_s.insert(env_s.end(), env.begin(), env.end());
  std::vector<char*> argv, envp;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw std::runtime_error("cannot write " + log_path);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // the test died: so does the server
    if (::getppid() != parent) ::_exit(127);
    ::dup2(log_fd, 1);
    ::dup2(log_fd, 2);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    ::dup2(null_fd, 0);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(log_fd);
  if (pid_ < 0) throw std::runtime_error("fork failed");
  ::setpgid(pid_, pid_);
  const std::regex listening(R"(rlserve listening on (tls://)?([^ ]+):(\d+) \(binary\).*; run folder (.+))");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::istringstream lines(log());
    std::string line;
    while (std::getline(lines, line)) {
      std::smatch m;
      if (std::regex_search(line, m, listening)) {
        port_ = std::stoi(m[3]);
        run_folder_ = m[4];
        return;
      }
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("rlserve serve exited before listening (is " + argv_s[0] +
                               " installed? run `make` at the repository root to build .venv):\n" + log());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  kill9();
  throw std::runtime_error("rlserve serve did not print its listening line in time:\n" + log());
}

ServerProcess::~ServerProcess() { kill9(); }

std::string ServerProcess::address() const { return "127.0.0.1:" + std::to_string(port_); }

void ServerProcess::kill9() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

void ServerProcess::suspend() {
  if (pid_ > 0) ::kill(-pid_, SIGSTOP);
}

std::string ServerProcess::log() const {
  std::ifstream in(log_path_);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string http_get(int port, const std::string& path, const std::string& token) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval limit{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  std::string response;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
    if (!token.empty()) request += "Authorization: Bearer " + token + "\r\n";
    request += "\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buffer[65536];
      ssize_t n;
      while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) response.append(buffer, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  const auto body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos) return "";
  return response.substr(body + 4);
}

}  // namespace e2e
