// The network client with local inference (docs/protocol.md section 14): the client fetches
// the policy's network with `get_weights`, computes every action itself (no round trip per
// step), cuts each episode's steps into fragments and ships them in `report_samples` batches
// from a background thread. A batch keeps its batch_id until the server answers it, so a batch
// whose reply was lost is re-sent after reconnecting and trained on once; batches wait (up to
// max_buffered_steps, the oldest dropped past it) while the server is down. A second thread
// refreshes the weights every update_interval seconds, fetching only a changed version.
// Single-agent episodes of any action space (section 6.3).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rlserve/client.hpp"
#include "rlserve/policy.hpp"
#include "rlserve/random.hpp"

namespace rlserve {

/// How a LocalClient connects (the ClientOptions; inference_mode is set to "local"), batches
/// and refreshes.
struct LocalOptions : ClientOptions {
  std::string policy_id = "default";   ///< the policy that acts
  std::size_t fragment_length = 200;   ///< steps per fragment (an episode's end cuts one too)
  std::size_t batch_steps = 1000;      ///< steps per report (fewer when the frame limit says so)
  double flush_interval = 1.0;         ///< seconds a step waits at most before it is shipped
  std::size_t max_buffered_steps = 100000;  ///< unshipped steps kept; the oldest dropped past it
  double update_interval = 5.0;        ///< seconds between weight refreshes; <= 0: only on request
  bool explore = true;                 ///< sample actions (false: the distribution's mode)
  std::uint64_t seed = 0;              ///< the action sampler's seed; 0: a random one
};

/// What a LocalClient has done with its steps.
struct LocalCounts {
  std::uint64_t steps_taken = 0;     ///< steps recorded for training
  std::uint64_t steps_shipped = 0;   ///< steps of batches the server accepted (duplicates included once)
  std::uint64_t steps_dropped = 0;   ///< steps dropped because the buffer was full
  std::uint64_t steps_refused = 0;   ///< steps of batches the server refused (bad_value, ...)
  std::uint64_t batches_sent = 0;    ///< batches the server answered
  std::uint64_t duplicates = 0;      ///< answers with duplicate: true (a re-sent batch the server had)
  std::uint64_t weights_fetches = 0; ///< full weights replies taken (the first included)
};

/// A local-inference client. Every call is thread-safe; errors are returned, never thrown.
class LocalClient {
 public:
  /// Connects twice to `address` (one connection for reports, one for weights), fetches the
  /// policy's weights (waiting for the learner's first ones) and starts the two threads.
  /// Several front-ends of one run, comma-separated: when the one in use dies the client moves
  /// to another, re-sends the unanswered batch there and fetches that one's weights.
  static Result<std::unique_ptr<LocalClient>> connect(const std::string& address, LocalOptions options = {});
  /// Stops the threads (at once: a report or weights fetch waiting on the server is cut off);
  /// steps not yet shipped are lost (call close() to ship them).
  ~LocalClient();
  LocalClient(const LocalClient&) = delete;
  LocalClient& operator=(const LocalClient&) = delete;

  /// Starts an episode (named here; the server learns of it from its fragments). An episode
  /// with training_enabled=false acts but ships no step, only its summary at the end (the
  /// server counts it in its episode metrics and its length in samples/env_steps).
  Result<std::string> start_episode(const std::string& episode_id = "", bool training_enabled = true);
  /// The policy's action for `observation`, computed here with the weights held now.
  Result<ServerAction> get_action(const std::string& episode_id, const Value& observation);
  /// The same for a Box (or Discrete) observation space given as plain numbers, row-major.
  Result<ServerAction> get_action(const std::string& episode_id, const std::vector<float>& observation);
  /// Records an action the policy did not choose (a human, a script), a value of the action
  /// space: shipped with policy_chosen false.
  Status log_action(const std::string& episode_id, const Value& observation, const Value& action);
  /// Adds `reward` (and `info`, a map merged into the step's: shipped in the fragment's `infos`)
  /// to the episode's previous action.
  Status log_returns(const std::string& episode_id, double reward, const std::optional<Value>& info = std::nullopt);
  /// Ends the episode (`truncated`: cut short, e.g. a time limit): its last fragment and its
  /// summary are queued for shipping.
  Status end_episode(const std::string& episode_id, const Value& observation, bool truncated = false);
  /// The same for plain numbers.
  Status end_episode(const std::string& episode_id, const std::vector<float>& observation, bool truncated = false);

  /// Multi-agent episodes (section 15.9; every agent must map to policy_id): the actions of
  /// the agents that act now, computed here, each agent with its own steps and memory.
  Result<std::map<std::string, ServerAction>> get_agent_actions(const std::string& episode_id,
                                                                const std::map<std::string, Value>& observations);
  /// Rewards for agents' previous actions, and agents that are done (`true`: terminated,
  /// `false`: truncated, whose last step is dropped).
  Status log_agent_returns(const std::string& episode_id, const std::map<std::string, double>& rewards,
                           const std::map<std::string, bool>& done = {});
  /// Ends a multi-agent episode with the final observations of the agents that have one; the
  /// others end without one (as done marks with `truncated`).
  Status end_agent_episode(const std::string& episode_id, const std::map<std::string, Value>& observations,
                           bool truncated = false);

  /// Ships everything queued and waits for the server's answers (up to `timeout_s`); timeout
  /// naming what is still buffered when they do not come.
  Status flush(double timeout_s);
  /// Flushes (within the reconnect timeout), stops the threads and disconnects; it returns then
  /// even while a report waits on a server that stopped answering (not after the request
  /// timeout). An error when steps were dropped, refused or left unshipped, saying how many.
  Status close();
  /// Fetches the weights now (only when the server's version changed); the version held.
  Result<std::uint64_t> refresh_weights();

  /// The weights version that acts now.
  std::uint64_t weights_version() const;
  LocalCounts counts() const;
  /// Steps recorded and not yet answered by the server.
  std::uint64_t buffered_steps() const;
  /// The observation space of the policy.
  Space observation_space() const;
  /// The action space of the policy.
  Space action_space() const { return action_space_; }
  /// Plain numbers as a value of the observation space, in ServerAction::values' order.
  Result<Value> observation_value(const std::vector<float>& observation) const;
  /// Plain numbers as a value of the action space (log_action's), in ServerAction::values' order.
  Result<Value> action_value(const std::vector<double>& numbers) const;
  /// The steps per fragment in use (fragment_length, lowered when a fragment would not fit
  /// the server's frame or array limits).
  std::size_t fragment_length() const { return options_.fragment_length; }
  /// Testing aid, what a network fault does: the reply to the next report is lost, so the
  /// shipper reconnects and re-sends the batch under its batch_id.
  void drop_next_report_reply();

 private:
  struct Episode;
  struct Batch {
    std::string batch_id;
    Value message;
    std::uint64_t steps = 0;
  };

  explicit LocalClient(LocalOptions options);
  Status start(const std::string& address);
  Result<ServerAction> step(const std::string& episode_id, const Value& observation, const std::vector<double>* logged,
                            const char* call);
  Result<ServerAction> act(Episode& episode, const std::vector<float>& flat, const std::vector<double>* logged);
  Status check_agents(const std::string& episode_id, const std::map<std::string, Value>& observations,
                      std::map<std::string, std::vector<float>>& flat) const;
  void finish_agent(const std::string& id, Episode& agent, bool terminated);
  void summarise(const std::string& id, const Episode& episode, bool truncated);
  void cut(const std::string& id, Episode& episode, const std::vector<float>& last_obs, bool terminated, bool truncated);
  Result<std::vector<float>> flat_observation(const Value& observation, const std::string& what) const;
  void form_batches(bool all);
  std::vector<Batch> make_batches(std::vector<Value> fragments, std::vector<std::uint64_t> steps,
                                  std::vector<Value> summaries) const;
  void ship_loop();
  void refresh_loop();
  Result<std::uint64_t> fetch_weights(double reconnect_s);
  Result<Value> send_batch(const Batch& batch, bool drop_reply);
  void stop_threads();

  LocalOptions options_;
  Space observation_space_, action_space_;
  std::size_t action_columns_ = 0;
  Limits limits_;
  Welcome welcome_;  // the first front-end's (the agent mapping)

  mutable std::mutex mutex_;  // everything below up to the threads
  std::condition_variable changed_;
  std::shared_ptr<const Policy> policy_;
  Rng rng_;
  std::map<std::string, std::unique_ptr<Episode>> episodes_;
  std::vector<Value> ready_fragments_;
  std::vector<std::uint64_t> ready_steps_;
  std::vector<Value> ready_summaries_;
  std::uint64_t ready_total_ = 0;
  std::deque<Batch> outbox_;
  std::uint64_t in_flight_steps_ = 0;
  bool in_flight_ = false;
  bool refresh_due_ = false;
  int flushing_ = 0;
  bool stopping_ = false;
  bool drop_next_reply_ = false;
  LocalCounts counts_;
  std::optional<Error> refused_;

  std::mutex weights_mutex_;  // the weights connection
  std::unique_ptr<Connection> weights_conn_;
  std::string weights_instance_;  // the instance_id of the server the held weights came from
  std::unique_ptr<Connection> report_conn_;  // the shipper thread's only
  std::thread shipper_, refresher_;
};

}  // namespace rlserve
