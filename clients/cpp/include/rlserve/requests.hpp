// The client's requests (docs/protocol.md section 7), built as messages: the seam the network
// client writes through. Optional fields left unset are not sent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rlserve/value.hpp"

namespace rlserve {

/// `hello` (7.1).
struct Hello {
  std::optional<std::string> client_name;
  std::optional<std::string> token;
  std::string inference_mode = "remote";
  bool map_agents = false;                ///< sent only when true
  std::optional<std::string> client_id;
};
Value hello_request(std::uint64_t id, const Hello& h);

/// `start_episode` (7.2).
Value start_episode_request(std::uint64_t id, const std::string& episode_id, bool training_enabled = true,
                            const std::optional<std::string>& policy_id = std::nullopt);

/// What the single-form step requests carry besides the observation (7.3-7.6).
struct StepExtras {
  std::optional<double> reward;   ///< the previous action's reward
  std::optional<Value> info;      ///< the previous action's info map
  std::optional<std::uint64_t> seq;  ///< the episode's call number (9.9)
};

/// `get_action`, single form.
Value get_action_request(std::uint64_t id, const std::string& episode_id, Value observation,
                         const StepExtras& extras = {});
/// `get_action`, batched form: `observations` one [N, ...] array (Box) or a list of N values.
Value get_action_batch_request(std::uint64_t id, const std::vector<std::string>& episode_ids, Value observations,
                               const std::optional<std::vector<double>>& rewards = std::nullopt,
                               const std::optional<std::vector<std::uint64_t>>& seqs = std::nullopt);
/// `log_action`, single form.
Value log_action_request(std::uint64_t id, const std::string& episode_id, Value observation, Value action,
                         const StepExtras& extras = {});
/// `log_returns`, single form.
Value log_returns_request(std::uint64_t id, const std::string& episode_id, double reward,
                          const std::optional<Value>& info = std::nullopt,
                          const std::optional<std::uint64_t>& seq = std::nullopt);
/// `end_episode`, single form.
Value end_episode_request(std::uint64_t id, const std::string& episode_id, Value observation, bool truncated,
                          const StepExtras& extras = {});
/// `ping` (7.7).
Value ping_request(std::uint64_t id);
/// `get_weights` (7.9).
Value get_weights_request(std::uint64_t id, const std::string& policy_id = "default",
                          const std::optional<std::uint64_t>& have_version = std::nullopt);

}  // namespace rlserve
