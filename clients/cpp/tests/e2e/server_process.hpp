// A real `rlserve serve` for the end-to-end tests: started in its own process group on
// 127.0.0.1, found by its listening line, killed (the whole group) when the handle goes, and
// killed by the kernel if the test process dies first.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace e2e {

/// One server process.
class ServerProcess {
 public:
  /// Starts `<bin_dir>/rlserve serve <args>` with `env` added to the environment; stdout and
  /// stderr go to `log_path`. Waits up to `timeout_s` for its listening line; throws
  /// std::runtime_error with the log when it does not come.
  ServerProcess(const std::string& bin_dir, const std::vector<std::string>& args,
                const std::vector<std::string>& env, const std::string& log_path, double timeout_s = 60);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  /// The binary port it listens on.
  int port() const { return port_; }
  /// `127.0.0.1:<port>`.
  std::string address() const;
  /// The run folder its listening line names.
  const std::string& run_folder() const { return run_folder_; }
  /// SIGKILL to the whole process group, then reaps the server.
  void kill9();
  /// SIGSTOP to the whole process group: the server hangs (its sockets accept and read
  /// nothing) until it is killed.
  void suspend();
  /// What the server wrote so far.
  std::string log() const;

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  std::string run_folder_;
  std::string log_path_;
};

/// `GET <path>` over HTTP/1.1 on 127.0.0.1:`port` (Bearer `token` when not empty): the body,
/// empty on any failure.
std::string http_get(int port, const std::string& path, const std::string& token);

}  // namespace e2e
