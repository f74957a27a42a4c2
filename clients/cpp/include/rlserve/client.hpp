// The network client with remote inference (docs/protocol.md sections 7, 9 and 11): the server
// computes each action, one round trip per step. The same calls and guarantees as the Python
// client's remote mode: observations checked against the server's space before sending, the
// reward logged by log_returns travelling with the episode's next call, end_episode pipelined,
// per-episode `seq` numbers so that a call re-sent after a broken connection is applied once,
// and the episodes of a restarted server reported lost (ErrorCode::episode_lost).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "rlserve/connection.hpp"
#include "rlserve/spaces.hpp"

namespace rlserve {

class RemoteSession;

/// How a Client connects (the ConnectionOptions) and checks what it sends.
struct ClientOptions : ConnectionOptions {
  /// Check observations against the server's observation space before sending (a bad one is a
  /// bad_value naming where, without a round trip).
  bool check_observations = true;
};

/// An action as the server sent it, and its numbers.
struct ServerAction {
  /// In the action space's form (section 6.3): an integer for Discrete, an array for Box,
  /// MultiDiscrete and MultiBinary, a map for Dict, a list for Tuple.
  Value value;
  /// Its numbers in order: the Discrete value (one number); a Box's, MultiDiscrete's or
  /// MultiBinary's elements row-major; a Dict's members in key order, a Tuple's in order, each
  /// flattened so. (Values, not choice indices: a Discrete with start 1 gives 1 for its first.)
  std::vector<double> values;
  /// The first number as an integer: the choice of a Discrete action space.
  std::int64_t discrete() const noexcept { return values.empty() ? 0 : static_cast<std::int64_t>(values[0]); }
};

/// A remote-inference client. Every call is thread-safe (serialised by one mutex); errors are
/// returned, never thrown: the server's with its code (episode_error, bad_value, ...) and message.
class Client {
 public:
  /// Connects to `address` (`host:port`, or `tls://host:port` with options.tls_ca) and says
  /// hello. An empty options.client_id is replaced by a random one (32 hex characters), kept
  /// for every reconnection so that the client keeps its episodes. Several front-ends of one
  /// run, comma-separated ("127.0.0.1:9900,127.0.0.1:9910"): the first that answers is used,
  /// and when it dies the client moves to another (Connection says how); the episodes open on
  /// the dead one then fail with episode_lost.
  static Result<std::unique_ptr<Client>> connect(const std::string& address, ClientOptions options = {});
  /// Drops the connection without reading pending replies: call close() first to learn whether
  /// a pipelined end_episode was refused.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Starts an episode; its id (a random one for an empty `episode_id`). An empty `policy_id`
  /// means the server's `default`. A random id's start is pipelined (no round trip of its own):
  /// only a server limit can refuse it then (the server-wide one, or the per-client one when
  /// other clients share this client id), and that capacity error is returned
  /// by the next call, naming the start. A chosen id waits for the reply.
  Result<std::string> start_episode(const std::string& episode_id = "", bool training_enabled = true,
                                    const std::string& policy_id = "");
  /// The policy's action for `observation` (a value of the observation space, section 6.3), with
  /// the reward logged since the episode's last call.
  Result<ServerAction> get_action(const std::string& episode_id, const Value& observation);
  /// The same for a Box (or Discrete) observation space given as plain numbers, row-major.
  Result<ServerAction> get_action(const std::string& episode_id, const std::vector<float>& observation);
  /// One round trip for several episodes of one policy (a vectorised simulator): one action per
  /// episode, in the order of `episode_ids`.
  Result<std::vector<ServerAction>> get_actions(const std::vector<std::string>& episode_ids,
                                          const std::vector<Value>& observations);
  /// Records an action the policy did not choose (a human, a script), with the pending reward.
  Status log_action(const std::string& episode_id, const Value& observation, const Value& action);
  /// Adds `reward` (and `info`) to the episode's previous action; sent with its next call.
  Status log_returns(const std::string& episode_id, double reward, const std::optional<Value>& info = std::nullopt);
  /// Ends the episode (`truncated`: cut short, e.g. a time limit). Pipelined: a refusal is
  /// returned by the next call, naming this episode.
  Status end_episode(const std::string& episode_id, const Value& observation, bool truncated = false);
  /// The same for plain numbers.
  Status end_episode(const std::string& episode_id, const std::vector<float>& observation, bool truncated = false);

  /// Multi-agent episodes (section 15): the actions of the agents that act now.
  Result<std::map<std::string, ServerAction>> get_agent_actions(const std::string& episode_id,
                                                          const std::map<std::string, Value>& observations);
  /// Rewards for agents' previous actions, and agents that are done (`true`: terminated,
  /// `false`: truncated). Sent at once.
  Status log_agent_returns(const std::string& episode_id, const std::map<std::string, double>& rewards,
                           const std::map<std::string, bool>& done = {});
  /// Ends a multi-agent episode with the final observations of the agents that have one.
  Status end_agent_episode(const std::string& episode_id, const std::map<std::string, Value>& observations,
                           bool truncated = false);

  /// Reads the pipelined replies (returning a deferred error) and disconnects.
  Status close();

  /// The plain numbers as a value of the observation space, in ServerAction::values' order (an
  /// array of its shape and dtype for a Box, an integer for a Discrete, a map for a Dict, ...);
  /// bad_value naming the expected count otherwise.
  Result<Value> observation_value(const std::vector<float>& observation) const;
  /// The same for an action (log_action's), as ServerAction::values gives it.
  Result<Value> action_value(const std::vector<double>& numbers) const;
  /// The policy an agent of a multi-agent episode acts for by the welcome's mapping (section
  /// 15.2: exact ids, then the first matching pattern, then the only policy when there are no
  /// rules); bad_value when no rule maps it, naming the fix.
  Result<std::string> agent_policy(const std::string& agent) const;
  /// The plain numbers as a value of the observation space of the agent's policy.
  Result<Value> agent_observation_value(const std::string& agent, const std::vector<float>& observation) const;
  /// The server's latest welcome.
  Welcome welcome() const;
  /// The observation space of the served policy (`default`, else the first).
  Space observation_space() const;
  /// The action space of the served policy (`default`, else the first).
  Space action_space() const;
  /// Successful reconnections so far.
  int reconnects() const;
  /// The front-end in use (`host:port`).
  std::string front_end() const;
  /// The client identity sent in every hello.
  std::string client_id() const;
  /// Testing aid, what a network fault does: the next call's reply is lost (the connection is
  /// shut down when it arrives), so the call reconnects and re-sends it.
  void drop_next_reply();

 private:
  Client(std::vector<Address> front_ends, ClientOptions options);
  Status read_spaces();
  Result<Space> policy_space(const std::string& policy, const char* which) const;
  Status check(const Value& observation, const std::string& where) const;
  void forget();
  void drop(const std::string& episode_id);
  std::optional<double> take_reward(const std::string& id) const;

  mutable std::mutex mutex_;
  ClientOptions options_;
  std::unique_ptr<Connection> conn_;
  std::unique_ptr<RemoteSession> session_;
  Space observation_space_, action_space_;
  std::string instance_id_;
  std::unordered_map<std::string, double> pending_reward_;
  std::unordered_map<std::string, Value> pending_info_;
};

/// 32 random hex characters (a client_id or an episode id).
std::string random_hex_id();

}  // namespace rlserve
