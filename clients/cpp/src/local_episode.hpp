// LocalClient's open episode (private to the library).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "rlserve/local_client.hpp"

namespace rlserve {

/// One open episode: the steps of its current fragment and its totals.
struct LocalClient::Episode {
  bool training = true;
  std::vector<float> obs;          // T rows of obs_dim
  std::vector<double> actions;     // T rows of the flat action layout
  std::vector<float> rewards, logp;
  std::vector<std::int64_t> versions;
  std::vector<bool> chosen;        // false where the action was logged (log_action)
  std::vector<Value> infos;        // each step's info (nil: none)
  bool any_info = false;
  std::vector<float> state, state_in;  // the policy's memory, and the state before the fragment
  double total_return = 0.0;
  std::uint64_t length = 0;
  std::size_t steps() const { return rewards.size(); }
  /// Multi-agent episodes (section 15.9): each agent's steps, fragments of their own.
  bool multi_agent = false;
  std::map<std::string, std::unique_ptr<Episode>> agents;
  std::set<std::string> done;  // agents marked done
};

}  // namespace rlserve
