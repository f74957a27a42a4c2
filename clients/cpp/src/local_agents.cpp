// LocalClient: multi-agent episodes with local inference (docs/protocol.md sections 15.5 and
// 15.9). Each agent's steps are fragments of their own under the episode's id; a terminated
// agent's last step is complete (its last observation stands in as the final one), a truncated
// agent's last step is dropped; one summary per episode.
#include "agent_mapping.hpp"
#include "local_episode.hpp"

#include <cmath>

namespace rlserve {
namespace {

std::string agent_names(const std::map<std::string, Value>& observations) {
  std::string out;
  for (const auto& entry : observations) out += (out.empty() ? "'" : ", '") + entry.first + "'";
  return out;
}

}  // namespace

// Checks the agents' policies and flattens their observations (no lock needed: both are fixed).
Status LocalClient::check_agents(const std::string& episode_id, const std::map<std::string, Value>& observations,
                                 std::map<std::string, std::vector<float>>& flat) const {
  for (const auto& [agent, observation] : observations) {
    auto policy = map_agent(welcome_, agent);
    if (!policy) return policy.error();
    if (*policy != options_.policy_id) {
      return make_error(ErrorCode::invalid_argument, "agent '" + agent + "' acts for policy '" + *policy + "', and this client "
                                                     "infers for '" + options_.policy_id + "' only; connect one LocalClient "
                                                     "per policy, or a Client (remote inference)");
    }
    auto f = flat_observation(observation, "episode '" + episode_id + "', agent '" + agent + "'");
    if (!f) return f.error();
    flat.emplace(agent, std::move(*f));
  }
  return ok_status();
}

Result<std::map<std::string, ServerAction>> LocalClient::get_agent_actions(
    const std::string& episode_id, const std::map<std::string, Value>& observations) {
  if (observations.empty()) return make_error(ErrorCode::invalid_argument, "get_agent_actions needs at least one agent");
  std::map<std::string, std::vector<float>> flat;
  if (auto s = check_agents(episode_id, observations, flat); !s) return s.error();
  std::map<std::string, ServerAction> out;
  bool cutting = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = episodes_.find(episode_id);
    if (it == episodes_.end()) {
      return make_error(ErrorCode::episode_error, "get_agent_actions: episode '" + episode_id + "' is not open; call start_episode first");
    }
    Episode& e = *it->second;
    if (!e.multi_agent && e.length > 0) {
      return make_error(ErrorCode::episode_error, "get_agent_actions: episode '" + episode_id + "' is single-agent; use get_action");
    }
    for (const auto& [agent, _] : observations) {
      if (e.done.count(agent)) {
        return make_error(ErrorCode::episode_error, "agent '" + agent + "' of episode '" + episode_id +
                                                        "' is done and cannot act again; use a new agent id for a new agent");
      }
    }
    e.multi_agent = true;
    for (const auto& [agent, obs] : flat) {
      auto& slot = e.agents[agent];
      if (!slot) {
        slot = std::make_unique<Episode>();
        slot->training = e.training;
        slot->state.assign(policy_->model().state_size(), 0.0f);
        slot->state_in = slot->state;
      }
      Episode& a = *slot;
      if (a.training && a.steps() >= options_.fragment_length) {
        cut(episode_id, a, obs, false, false);
        cutting = true;
      }
      auto action = act(a, obs, nullptr);
      if (!action) return action.error();
      ++e.length;
      out.emplace(agent, std::move(*action));
    }
  }
  if (cutting) changed_.notify_all();
  return out;
}

// Called with mutex_ held: the agent's last fragment (section 15.5).
void LocalClient::finish_agent(const std::string& id, Episode& a, bool terminated) {
  if (!a.training || a.steps() == 0) return;
  const std::size_t d = observation_space_.flat_dim();
  std::vector<float> last(a.obs.end() - static_cast<std::ptrdiff_t>(d), a.obs.end());
  if (terminated) {
    cut(id, a, last, true, false);
    return;
  }
  // Truncated: no observation after the last action to bootstrap from; that step is dropped.
  a.obs.resize(a.obs.size() - d);
  a.actions.resize(a.actions.size() - action_columns_);
  a.rewards.pop_back();
  a.logp.pop_back();
  a.chosen.pop_back();
  a.infos.pop_back();
  a.versions.pop_back();
  --counts_.steps_taken;
  if (a.steps() > 0) cut(id, a, last, false, true);
}

Status LocalClient::log_agent_returns(const std::string& episode_id, const std::map<std::string, double>& rewards,
                                      const std::map<std::string, bool>& done) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = episodes_.find(episode_id);
    if (it == episodes_.end()) {
      return make_error(ErrorCode::episode_error, "log_agent_returns: episode '" + episode_id + "' is not open");
    }
    Episode& e = *it->second;
    const auto acted = [&](const std::string& agent) -> Status {
      if (e.done.count(agent)) {
        return make_error(ErrorCode::episode_error, "agent '" + agent + "' of episode '" + episode_id +
                                                        "' is done and cannot be rewarded or marked again");
      }
      if (!e.agents.count(agent)) {
        return make_error(ErrorCode::episode_error, "log_agent_returns names agent '" + agent + "', which has not acted in "
                                                    "episode '" + episode_id + "'; reward and mark only agents that acted");
      }
      return ok_status();
    };
    for (const auto& [agent, reward] : rewards) {
      if (auto s = acted(agent); !s) return s;
      if (!std::isfinite(reward) || std::fabs(reward) > 1e9) {
        return make_error(ErrorCode::bad_value, "log_agent_returns: agent '" + agent + "''s reward is not finite or "
                                                "outside -1e9..1e9");
      }
    }
    for (const auto& entry : done) {
      if (auto s = acted(entry.first); !s) return s;
    }
    for (const auto& [agent, reward] : rewards) {
      Episode& a = *e.agents[agent];
      if (a.steps() > 0) a.rewards.back() += static_cast<float>(reward);
      e.total_return += reward;
    }
    for (const auto& [agent, terminated] : done) {
      finish_agent(episode_id, *e.agents[agent], terminated);
      e.agents.erase(agent);
      e.done.insert(agent);
    }
  }
  changed_.notify_all();
  return ok_status();
}

Status LocalClient::end_agent_episode(const std::string& episode_id, const std::map<std::string, Value>& observations,
                                      bool truncated) {
  std::map<std::string, std::vector<float>> flat;
  if (auto s = check_agents(episode_id, observations, flat); !s) return s;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = episodes_.find(episode_id);
    if (it == episodes_.end()) {
      return make_error(ErrorCode::episode_error, "end_agent_episode: episode '" + episode_id + "' is not open");
    }
    Episode& e = *it->second;
    if (!e.multi_agent && e.length > 0) {
      return make_error(ErrorCode::episode_error, "end_agent_episode: episode '" + episode_id + "' is single-agent; use end_episode");
    }
    for (const auto& [agent, _] : flat) {
      if (e.done.count(agent)) {
        return make_error(ErrorCode::episode_error, "end_agent_episode names agent '" + agent + "' of episode '" + episode_id +
                                                        "', which is done already (" + agent_names(observations) + ")");
      }
    }
    for (auto& [agent, a] : e.agents) {
      auto named = flat.find(agent);
      if (named != flat.end()) {
        if (a->training && a->steps() > 0) cut(episode_id, *a, named->second, !truncated, truncated);
      } else {
        finish_agent(episode_id, *a, !truncated);
      }
    }
    summarise(episode_id, e, truncated);
    episodes_.erase(it);
  }
  changed_.notify_all();
  return ok_status();
}

// Called with mutex_ held: the episode's summary, queued for shipping. A non-training episode's
// steps travel in no fragment; its summary says so, and the server counts them as env steps.
void LocalClient::summarise(const std::string& id, const Episode& e, bool truncated) {
  Value::Map summary{{"episode_id", id},
                     {"return", e.total_return},
                     {"length", Value(e.length)},
                     {"reason", truncated ? "truncated" : "terminated"}};
  if (!e.training) summary.emplace_back("training_enabled", Value(false));
  if (e.multi_agent) summary.emplace_back("policy_returns", Value(Value::Map{{options_.policy_id, e.total_return}}));
  ready_summaries_.push_back(Value(std::move(summary)));
}

}  // namespace rlserve
