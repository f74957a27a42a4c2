// Client: remote inference's calls (single-agent and batched); the multi-agent forms are in
// client_agents.cpp.
#include "rlserve/client.hpp"

#include <cmath>
#include <random>

#include "actions.hpp"
#include "numbers.hpp"
#include "remote_session.hpp"
#include "rlserve/limits.hpp"
#include "rlserve/requests.hpp"

namespace rlserve {
std::string random_hex_id() {
  static thread_local std::mt19937_64 gen{std::random_device{}() ^
                                          (static_cast<std::uint64_t>(std::random_device{}()) << 32)};
  static const char* digits = "0123456789abcdef";
  std::string out(32, '0');
  for (int half = 0; half < 2; ++half) {
    std::uint64_t bits = gen();
    for (int i = 0; i < 16; ++i, bits >>= 4) out[static_cast<std::size_t>(half * 16 + i)] = digits[bits & 15];
  }
  return out;
}

Client::Client(std::vector<Address> front_ends, ClientOptions options) : options_(std::move(options)) {
  conn_ = std::make_unique<Connection>(std::move(front_ends), options_);
}

Client::~Client() {
  if (conn_) conn_->drop();
}

Result<std::unique_ptr<Client>> Client::connect(const std::string& address, ClientOptions options) {
  auto parsed = parse_addresses(address);
  if (!parsed) return parsed.error();
  if (options.inference_mode != "remote") {
    return make_error(ErrorCode::invalid_argument, "a Client infers remotely (inference_mode \"remote\"); for local "
                                                   "inference connect an rlserve::LocalClient (rlserve/local_client.hpp)");
  }
  if (options.client_id.empty()) options.client_id = random_hex_id();
  std::unique_ptr<Client> client(new Client(*parsed, std::move(options)));
  auto welcome = client->conn_->open();
  if (!welcome) return welcome.error();
  if (auto s = client->read_spaces(); !s) return s.error();
  Client* self = client.get();
  client->session_ = std::make_unique<RemoteSession>(
      *client->conn_, [self] { self->forget(); }, [self](const std::string& id) { self->drop(id); });
  return client;
}

Status Client::read_spaces() {
  const Welcome& w = conn_->welcome();
  std::string name = "default";
  if (w.policies.present("default") == nullptr && w.policies.as_map() && !w.policies.as_map()->empty()) {
    name = w.policies.as_map()->front().first;
  }
  auto obs = policy_space(name, "observation_space");
  if (!obs) return obs.error();
  auto act = policy_space(name, "action_space");
  if (!act) return act.error();
  observation_space_ = std::move(*obs);
  action_space_ = std::move(*act);
  instance_id_ = w.instance_id;
  return ok_status();
}

Result<Space> Client::policy_space(const std::string& policy, const char* which) const {
  const Value* p = conn_->welcome().policies.present(policy);
  const Value* description = p ? p->present(which) : nullptr;
  if (description == nullptr) {
    return make_error(ErrorCode::decode_error, "the server's welcome has no " + std::string(which) + " for policy '" + policy + "'");
  }
  return parse_space(*description);
}

void Client::forget() {
  pending_reward_.clear();
  pending_info_.clear();
}

void Client::drop(const std::string& episode_id) {
  pending_reward_.erase(episode_id);
  pending_info_.erase(episode_id);
}

Status Client::check(const Value& observation, const std::string& where) const {
  if (!options_.check_observations) return ok_status();
  std::vector<float> flat;
  return flatten(observation_space_, observation, flat, where);
}

std::optional<double> Client::take_reward(const std::string& id) const {
  auto it = pending_reward_.find(id);
  if (it == pending_reward_.end()) return std::nullopt;
  return it->second;
}

Result<Value> Client::observation_value(const std::vector<float>& observation) const {
  return value_from_numbers(observation_space_, std::vector<double>(observation.begin(), observation.end()), "observation");
}

Result<Value> Client::action_value(const std::vector<double>& numbers) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return value_from_numbers(action_space_, numbers, "action");
}

Result<std::string> Client::start_episode(const std::string& episode_id, bool training_enabled,
                                          const std::string& policy_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string id = episode_id.empty() ? random_hex_id() : episode_id;
  Value start = start_episode_request(0, id, training_enabled,
                                      policy_id.empty() ? std::optional<std::string>("default") : policy_id);
  // A random id is started pipelined (no round trip of its own): it cannot be taken, and this
  // client's episode limit is checked here, so only a server limit can refuse it (that
  // error is returned by the next call). A chosen id, or a start at the limit, waits.
  // A policy the welcome does not name waits too: the server's refusal comes from this call.
  const std::size_t limit = conn_->limits().max_episodes_per_client;
  const Value& served = conn_->welcome().policies;
  const bool known = policy_id.empty() || served.present(policy_id.c_str()) != nullptr;
  if (episode_id.empty() && known && session_->open_count() + 1 < limit) {
    if (auto s = session_->send_nowait(std::move(start), false); !s) return s.error();
    session_->started(id);
    return id;
  }
  auto reply = session_->request(std::move(start));
  if (!reply) return reply.error();
  const Value* started = reply->present("episode_id");
  if (started == nullptr || started->as_string() == nullptr) {
    return make_error(ErrorCode::decode_error, "episode_started without an episode_id");
  }
  session_->started(*started->as_string());
  return *started->as_string();
}

Result<ServerAction> Client::get_action(const std::string& episode_id, const std::vector<float>& observation) {
  Result<Value> value = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    return observation_value(observation);
  }();
  if (!value) return value.error();
  return get_action(episode_id, *value);
}

Result<ServerAction> Client::get_action(const std::string& episode_id, const Value& observation) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto s = session_->check_not_lost({episode_id}); !s) return s.error();
  if (instance_id_ != conn_->welcome().instance_id) read_spaces();
  if (auto s = check(observation, "observation"); !s) {
    return make_error(s.error().code, "get_action for episode '" + episode_id + "': " + s.error().message);
  }
  const std::uint64_t seq = session_->next_seq(episode_id);
  StepExtras extras;
  extras.reward = take_reward(episode_id);
  if (auto it = pending_info_.find(episode_id); it != pending_info_.end()) extras.info = it->second;
  extras.seq = seq;
  auto reply = session_->request(get_action_request(0, episode_id, observation, extras));
  if (!reply) return reply.error();
  pending_reward_.erase(episode_id);
  pending_info_.erase(episode_id);
  session_->accepted(episode_id, seq);
  const Value* action = reply->find("action");
  if (action == nullptr) return make_error(ErrorCode::decode_error, "the server's action reply has no 'action'");
  return action_of(*action);
}

Result<std::vector<ServerAction>> Client::get_actions(const std::vector<std::string>& episode_ids,
                                                const std::vector<Value>& observations) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (episode_ids.empty() || episode_ids.size() != observations.size()) {
    return make_error(ErrorCode::invalid_argument, "get_actions needs one observation per episode (got " +
                                                       std::to_string(episode_ids.size()) + " episodes and " +
                                                       std::to_string(observations.size()) + " observations)");
  }
  if (auto s = session_->check_not_lost(episode_ids); !s) return s.error();
  if (instance_id_ != conn_->welcome().instance_id) read_spaces();
  for (std::size_t i = 0; i < observations.size(); ++i) {
    if (auto s = check(observations[i], "observations[" + std::to_string(i) + "]"); !s) {
      return make_error(s.error().code, "get_action for episode '" + episode_ids[i] + "': " + s.error().message);
    }
  }
  auto stacked = stack_observations(observation_space_, observations);
  if (!stacked) return stacked.error();
  std::vector<double> rewards;
  std::vector<std::uint64_t> seqs;
  for (const auto& id : episode_ids) {
    rewards.push_back(take_reward(id).value_or(0.0));
    seqs.push_back(session_->next_seq(id));
  }
  Value message = get_action_batch_request(0, episode_ids, std::move(*stacked), rewards, seqs);
  bool any_info = false;
  Value::Array infos;
  for (const auto& id : episode_ids) {
    auto it = pending_info_.find(id);
    any_info = any_info || it != pending_info_.end();
    infos.push_back(it != pending_info_.end() ? it->second : Value());
  }
  if (any_info) message.as_map()->emplace_back("infos", Value(std::move(infos)));
  auto reply = session_->request(std::move(message));
  if (!reply) return reply.error();
  for (std::size_t i = 0; i < episode_ids.size(); ++i) {
    pending_reward_.erase(episode_ids[i]);
    pending_info_.erase(episode_ids[i]);
    session_->accepted(episode_ids[i], seqs[i]);
  }
  const Value* actions = reply->find("actions");
  if (actions == nullptr) return make_error(ErrorCode::decode_error, "the server's batched reply has no 'actions'");
  return actions_of(*actions, episode_ids.size());
}

Status Client::log_action(const std::string& episode_id, const Value& observation, const Value& action) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto s = session_->check_not_lost({episode_id}); !s) return s;
  if (auto s = check(observation, "observation"); !s) {
    return make_error(s.error().code, "log_action for episode '" + episode_id + "': " + s.error().message);
  }
  const std::uint64_t seq = session_->next_seq(episode_id);
  StepExtras extras;
  extras.reward = take_reward(episode_id);
  if (auto it = pending_info_.find(episode_id); it != pending_info_.end()) extras.info = it->second;
  extras.seq = seq;
  auto reply = session_->request(log_action_request(0, episode_id, observation, action, extras));
  if (!reply) return reply.error();
  pending_reward_.erase(episode_id);
  pending_info_.erase(episode_id);
  session_->accepted(episode_id, seq);
  return ok_status();
}

Status Client::log_returns(const std::string& episode_id, double reward, const std::optional<Value>& info) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto s = session_->check_not_lost({episode_id}); !s) return s;
  const double total = take_reward(episode_id).value_or(0.0) + reward;
  if (!std::isfinite(reward) || !(std::fabs(total) <= kMaxAbsReward)) {
    return make_error(ErrorCode::bad_value, "log_returns for episode '" + episode_id + "': reward " + std::to_string(reward) +
                                                " makes the rewards logged since the last action add up to " +
                                                std::to_string(total) + "; a step's reward must be finite and within -1e9..1e9");
  }
  Value merged = info.value_or(Value());
  if (auto it = pending_info_.find(episode_id); it != pending_info_.end() && info && info->as_map()) {
    Value::Map m = it->second.as_map() ? *it->second.as_map() : Value::Map{};
    for (const auto& [k, v] : *info->as_map()) {
      bool replaced = false;
      for (auto& [mk, mv] : m) {
        if (mk == k) {
          mv = v;
          replaced = true;
        }
      }
      if (!replaced) m.emplace_back(k, v);
    }
    merged = Value(std::move(m));
  } else if (it != pending_info_.end() && !info) {
    merged = it->second;
  }
  if (!session_->is_open(episode_id)) {  // not started here: sent now, so an unknown id is reported now
    const std::uint64_t seq = session_->next_seq(episode_id);
    auto reply = session_->request(log_returns_request(0, episode_id, total,
                                                       merged.is_nil() ? std::nullopt : std::optional<Value>(merged), seq));
    if (!reply) return reply.error();
    pending_reward_.erase(episode_id);
    pending_info_.erase(episode_id);
    session_->accepted(episode_id, seq);
    return ok_status();
  }
  pending_reward_[episode_id] = total;
  if (!merged.is_nil()) pending_info_[episode_id] = merged;
  return ok_status();
}

Status Client::end_episode(const std::string& episode_id, const std::vector<float>& observation, bool truncated) {
  Result<Value> value = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    return observation_value(observation);
  }();
  if (!value) return value.error();
  return end_episode(episode_id, *value, truncated);
}

Status Client::end_episode(const std::string& episode_id, const Value& observation, bool truncated) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto s = session_->check_not_lost({episode_id}); !s) return s;
  if (auto s = check(observation, "observation"); !s) {
    return make_error(s.error().code, "end_episode for episode '" + episode_id + "': " + s.error().message);
  }
  const std::uint64_t seq = session_->next_seq(episode_id);
  StepExtras extras;
  extras.reward = take_reward(episode_id);
  if (auto it = pending_info_.find(episode_id); it != pending_info_.end()) extras.info = it->second;
  extras.seq = seq;
  if (auto s = session_->send_nowait(end_episode_request(0, episode_id, observation, truncated, extras)); !s) return s;
  pending_reward_.erase(episode_id);
  pending_info_.erase(episode_id);
  session_->ended(episode_id, seq);
  return ok_status();
}

Status Client::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  return session_->close();
}

Welcome Client::welcome() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return conn_->welcome();
}

Space Client::observation_space() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return observation_space_;
}

Space Client::action_space() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return action_space_;
}

std::string Client::front_end() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return conn_->address().text();
}

int Client::reconnects() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return conn_->reconnects();
}

std::string Client::client_id() const { return options_.client_id; }

void Client::drop_next_reply() {
  std::lock_guard<std::mutex> lock(mutex_);
  conn_->drop_next_reply();
}

}  // namespace rlserve
