#include "rlserve/requests.hpp"

#include "rlserve/messages.hpp"

namespace rlserve {
namespace {

Value opt(const std::optional<std::string>& s) { return s ? Value(*s) : Value(); }
Value opt(const std::optional<double>& x) { return x ? Value(*x) : Value(); }
Value opt(const std::optional<std::uint64_t>& x) { return x ? Value(*x) : Value(); }
Value opt(const std::optional<Value>& v) { return v ? *v : Value(); }

void add_extras(Value::Map& m, const StepExtras& e) {
  m.emplace_back("reward", opt(e.reward));
  m.emplace_back("info", opt(e.info));
  m.emplace_back("seq", opt(e.seq));
}

}  // namespace

Value hello_request(std::uint64_t id, const Hello& h) {
  return make_message(MessageType::hello, id,
                      {{"protocol_version", kProtocolVersion}, {"client_name", opt(h.client_name)},
                       {"token", opt(h.token)}, {"inference_mode", h.inference_mode},
                       {"map_agents", h.map_agents ? Value(true) : Value()}, {"client_id", opt(h.client_id)}});
}

Value start_episode_request(std::uint64_t id, const std::string& episode_id, bool training_enabled,
                            const std::optional<std::string>& policy_id) {
  return make_message(MessageType::start_episode, id,
                      {{"episode_id", episode_id}, {"training_enabled", training_enabled}, {"policy_id", opt(policy_id)}});
}

Value get_action_request(std::uint64_t id, const std::string& episode_id, Value observation, const StepExtras& extras) {
  Value::Map m{{"episode_id", episode_id}, {"observation", std::move(observation)}};
  add_extras(m, extras);
  return make_message(MessageType::get_action, id, std::move(m));
}

Value get_action_batch_request(std::uint64_t id, const std::vector<std::string>& episode_ids, Value observations,
                               const std::optional<std::vector<double>>& rewards,
                               const std::optional<std::vector<std::uint64_t>>& seqs) {
  Value::Map m{{"episode_ids", string_array(episode_ids)}, {"observations", std::move(observations)}};
  if (rewards) m.emplace_back("rewards", Value::Array(rewards->begin(), rewards->end()));
  if (seqs) m.emplace_back("seqs", Value::Array(seqs->begin(), seqs->end()));
  return make_message(MessageType::get_action, id, std::move(m));
}

Value log_action_request(std::uint64_t id, const std::string& episode_id, Value observation, Value action,
                         const StepExtras& extras) {
  Value::Map m{{"episode_id", episode_id}, {"observation", std::move(observation)}, {"action", std::move(action)}};
  add_extras(m, extras);
  return make_message(MessageType::log_action, id, std::move(m));
}

Value log_returns_request(std::uint64_t id, const std::string& episode_id, double reward,
                          const std::optional<Value>& info, const std::optional<std::uint64_t>& seq) {
  return make_message(MessageType::log_returns, id,
                      {{"episode_id", episode_id}, {"reward", reward}, {"info", opt(info)}, {"seq", opt(seq)}});
}

Value end_episode_request(std::uint64_t id, const std::string& episode_id, Value observation, bool truncated,
                          const StepExtras& extras) {
  Value::Map m{{"episode_id", episode_id}, {"observation", std::move(observation)}, {"truncated", truncated}};
  add_extras(m, extras);
  return make_message(MessageType::end_episode, id, std::move(m));
}

Value ping_request(std::uint64_t id) { return make_message(MessageType::ping, id, {}); }

Value get_weights_request(std::uint64_t id, const std::string& policy_id, const std::optional<std::uint64_t>& have_version) {
  return make_message(MessageType::get_weights, id, {{"policy_id", policy_id}, {"have_version", opt(have_version)}});
}

}  // namespace rlserve
