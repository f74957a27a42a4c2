// One binary-carrier connection (docs/protocol.md section 3): hello/welcome, request ids,
// pipelined requests, typed server errors, and re-opening with back-off.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rlserve/error.hpp"
#include "rlserve/framing.hpp"
#include "rlserve/messages.hpp"
#include "rlserve/transport.hpp"

namespace rlserve {

/// Client timeouts, in seconds.
struct Timeouts {
  double connect = 10.0;    ///< to open the connection (TCP and TLS)
  double request = 60.0;    ///< for a reply (a first get_action waits for the learner's first weights)
  double reconnect = 30.0;  ///< how long a call keeps re-connecting and re-sending after a break
};

/// What a connection says in its `hello` and how it reaches the server.
struct ConnectionOptions {
  std::string token;                  ///< the server's token; empty: none
  std::string client_name = "cpp-client";
  std::string inference_mode = "remote";
  std::string client_id;              ///< the client identity sent in every hello; empty: none
  std::string tls_ca;                 ///< CA file (PEM) a tls:// server's certificate must chain to
  Timeouts timeouts;
};

/// A connection to one server, re-opened by reconnect(). It may be given several front-ends of
/// one run (ordinary servers, each with its own port): it uses the first that answers, and when
/// the connection breaks it dials the same one for kSameFrontEndGrace seconds, then the others
/// in turn from the one after it (itself last). Not thread-safe: the Client that owns it
/// serialises the calls.
class Connection {
 public:
  using Clock = std::chrono::steady_clock;
  /// Seconds a broken connection dials only its own front-end before it tries the others.
  static constexpr double kSameFrontEndGrace = 1.0;

  Connection(Address address, ConnectionOptions options);
  /// With several front-ends (at least one).
  Connection(std::vector<Address> front_ends, ConnectionOptions options);

  /// Connects (to the first front-end that answers, in order from the one in use) and says
  /// hello; the server's welcome. The server's refusal arrives typed (unauthorized,
  /// version_mismatch, ...) with its message; a peer that is not an rlserve binary port is a
  /// decode_error saying so; a front-end that serves other policies or spaces than the first
  /// one reached is invalid_argument naming it.
  Result<Welcome> open();
  /// Re-opens with exponential back-off (50 ms doubling to 2 s) until `deadline`, moving to
  /// another front-end as the class says; connection_lost naming the addresses when none
  /// answered.
  Result<Welcome> reconnect(Clock::time_point deadline);

  /// Sends `message` (its `id` is set here) and returns the reply; an `error` reply is returned
  /// as its typed Error. The replies of pipelined requests are read first: an error among them
  /// is returned before anything is sent (failed_message() names that request). Pipelined
  /// start_episode requests are not waited for (a fresh random id can only be refused for the
  /// server-wide limit): their replies are read on the way to this one's, and an error among
  /// them is returned by this call if it failed too, else by the next call. `raise_deferred`
  /// false, for a request that may have been applied already (re-sent after a lost
  /// connection): such an error is left for the next call, and an error reply is its own
  /// (unless it acts in the episode whose start was refused: that start's error then).
  Result<Value> request(Value message, bool raise_deferred = true);
  /// Sends `message` without waiting for its reply (the next call reads it). `settle_first`:
  /// first read the replies of earlier pipelined requests but starts (returning the first error
  /// among them); false: send at once, behind them (past kMaxPipelined on their way, they are
  /// read first).
  Status send_nowait(Value message, bool settle_first = true);
  /// Reads the replies of pipelined requests but starts; the first error among them.
  Status settle();
  /// The pipelined requests whose replies never came (the connection broke), oldest first;
  /// forgotten here.
  std::vector<Value> take_unanswered();
  /// The limits of the server's latest welcome.
  const Limits& limits() const noexcept { return limits_; }
  /// How many pipelined requests wait for their reply.
  std::size_t unanswered() const noexcept { return unanswered_.size(); }
  /// The pipelined request whose error was returned last, if any (cleared by clear_failed).
  const std::optional<Value>& failed_message() const noexcept { return failed_; }
  void clear_failed() noexcept { failed_.reset(); }
  /// Every pipelined request the server refused since the last call (the first one's error is
  /// returned; the caller undoes them all); forgotten here.
  std::vector<Value> take_refused() { return std::exchange(refused_, {}); }
  /// Pipelined requests sent without settling before a send waits for their replies.
  static constexpr std::size_t kMaxPipelined = 64;

  /// Settles pipelined requests and closes the connection.
  Status close();
  /// Shuts the socket down (a blocked read returns); the next call reconnects.
  void drop() noexcept;
  /// The one call another thread may make: shuts the socket down so that a blocked read
  /// returns, and makes every later open, reconnect and request fail at once with
  /// connection_lost (for closing a client whose server stopped answering).
  void interrupt() noexcept;

  /// Testing aid, what a network fault does: the next reply is read and thrown away and the
  /// connection shut down, so that the call reconnects and re-sends it.
  void drop_next_reply() noexcept { drop_next_reply_ = true; }

  /// The latest welcome (valid after a successful open).
  const Welcome& welcome() const noexcept { return welcome_; }
  /// Successful reconnections so far.
  int reconnects() const noexcept { return reconnects_; }
  /// The front-end in use (or dialled last).
  const Address& address() const noexcept { return front_ends_[index_]; }
  /// Every front-end, comma-separated.
  std::string front_end_names() const;
  const ConnectionOptions& options() const noexcept { return options_; }

 private:
  Result<std::uint64_t> send(Value& message);
  Result<Value> read_until(std::uint64_t id);
  Status receive_some();
  Error lost(Error why);
  Error interrupted_error() const;
  Result<Welcome> open_at(std::size_t index);
  Status check_served(std::size_t index, const Welcome& welcome);

  std::vector<Address> front_ends_;
  std::size_t index_ = 0;
  std::optional<Clock::time_point> lost_since_;
  std::optional<std::pair<std::size_t, Welcome>> first_;  // the first front-end reached and its welcome
  ConnectionOptions options_;
  std::unique_ptr<Transport> transport_;  // set and reset under transport_mutex_ (interrupt reads it)
  std::mutex transport_mutex_;
  std::atomic<bool> interrupted_{false};
  FrameReader reader_;
  Limits limits_;
  Welcome welcome_;
  bool welcomed_ = false;
  bool drop_next_reply_ = false;
  std::uint64_t next_id_ = 1;
  int reconnects_ = 0;
  std::map<std::uint64_t, Value> unanswered_;
  std::map<std::uint64_t, Value> replies_;
  std::optional<Error> deferred_;
  std::optional<Value> deferred_message_;
  std::optional<Value> failed_;
  std::vector<Value> refused_;

  Status read_pipelined(bool starts_too);
  Error take_deferred();
  /// Whether the kept error is of a refused start of an episode `message` acts in.
  bool refused_in(const Value& message) const;
};

/// The episode ids a request names: `episode_id`, or `episode_ids` of a batch; none for
/// start_episode and session requests.
std::vector<std::string> episodes_of(const Value& message);

}  // namespace rlserve
