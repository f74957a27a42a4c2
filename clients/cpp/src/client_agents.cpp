// Client: the multi-agent forms (docs/protocol.md section 15). Observations are sent as a list
// (always accepted); rewards and done marks go at once with log_agent_returns.
#include "actions.hpp"
#include "agent_mapping.hpp"
#include "numbers.hpp"
#include "remote_session.hpp"
#include "rlserve/client.hpp"
#include "rlserve/messages.hpp"

namespace rlserve {

Result<std::string> Client::agent_policy(const std::string& agent) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_agent(conn_->welcome(), agent);
}

Result<Value> Client::agent_observation_value(const std::string& agent, const std::vector<float>& observation) const {
  auto policy = agent_policy(agent);
  if (!policy) return policy.error();
  std::lock_guard<std::mutex> lock(mutex_);
  auto space = policy_space(*policy, "observation_space");
  if (!space) return space.error();
  return value_from_numbers(*space, std::vector<double>(observation.begin(), observation.end()),
                            "observation of agent '" + agent + "'");
}

Result<std::map<std::string, ServerAction>> Client::get_agent_actions(const std::string& episode_id,
                                                                const std::map<std::string, Value>& observations) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (observations.empty()) return make_error(ErrorCode::invalid_argument, "get_agent_actions needs at least one agent");
  if (auto s = session_->check_not_lost({episode_id}); !s) return s.error();
  std::vector<std::string> agents;
  Value::Array values;
  const bool one_policy = conn_->welcome().policies.as_map() && conn_->welcome().policies.as_map()->size() == 1;
  for (const auto& [agent, observation] : observations) {
    if (one_policy) {  // with several policies the server checks each agent against its own
      if (auto s = check(observation, "observation of agent '" + agent + "'"); !s) {
        return make_error(s.error().code, "get_action for episode '" + episode_id + "': " + s.error().message);
      }
    }
    agents.push_back(agent);
    values.push_back(observation);
  }
  const std::uint64_t seq = session_->next_seq(episode_id);
  auto reply = session_->request(make_message(MessageType::get_action, 0,
                                              {{"episode_id", episode_id}, {"agent_ids", string_array(agents)},
                                               {"observations", Value(std::move(values))}, {"seq", seq}}));
  if (!reply) return reply.error();
  session_->accepted(episode_id, seq);
  const Value* actions = reply->find("actions");
  if (actions == nullptr) return make_error(ErrorCode::decode_error, "the server's multi-agent reply has no 'actions'");
  auto list = actions_of(*actions, agents.size());
  if (!list) return list.error();
  std::map<std::string, ServerAction> out;
  for (std::size_t i = 0; i < agents.size(); ++i) out.emplace(agents[i], std::move((*list)[i]));
  return out;
}

Status Client::log_agent_returns(const std::string& episode_id, const std::map<std::string, double>& rewards,
                                 const std::map<std::string, bool>& done) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto s = session_->check_not_lost({episode_id}); !s) return s;
  std::vector<std::string> agents, terminated, truncated;
  Value::Array amounts;
  for (const auto& [agent, reward] : rewards) {
    agents.push_back(agent);
    amounts.emplace_back(reward);
  }
  for (const auto& [agent, is_terminated] : done) (is_terminated ? terminated : truncated).push_back(agent);
  const std::uint64_t seq = session_->next_seq(episode_id);
  Value::Map fields;
  fields.emplace_back("episode_id", Value(episode_id));
  fields.emplace_back("agent_ids", string_array(agents));
  fields.emplace_back("rewards", Value(std::move(amounts)));
  if (!terminated.empty()) fields.emplace_back("terminated_agents", string_array(terminated));
  if (!truncated.empty()) fields.emplace_back("truncated_agents", string_array(truncated));
  fields.emplace_back("seq", seq);
  auto reply = session_->request(make_message(MessageType::log_returns, 0, std::move(fields)));
  if (!reply) return reply.error();
  session_->accepted(episode_id, seq);
  return ok_status();
}

Status Client::end_agent_episode(const std::string& episode_id, const std::map<std::string, Value>& observations,
                                 bool truncated) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto s = session_->check_not_lost({episode_id}); !s) return s;
  std::vector<std::string> agents;
  Value::Array values;
  for (const auto& [agent, observation] : observations) {
    agents.push_back(agent);
    values.push_back(observation);
  }
  const std::uint64_t seq = session_->next_seq(episode_id);
  Value::Map fields{{"episode_id", episode_id}, {"agent_ids", string_array(agents)}};
  if (!agents.empty()) fields.emplace_back("observations", Value(std::move(values)));
  fields.emplace_back("truncated", truncated);
  fields.emplace_back("seq", seq);
  if (auto s = session_->send_nowait(make_message(MessageType::end_episode, 0, std::move(fields))); !s) return s;
  session_->ended(episode_id, seq);
  return ok_status();
}

}  // namespace rlserve
