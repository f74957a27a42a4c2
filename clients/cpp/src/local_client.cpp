// LocalClient: acting with the held weights and cutting each episode's steps into fragments
// (docs/protocol.md sections 7.10 and 14); the threads and batches are in local_shipping.cpp.
#include "rlserve/local_client.hpp"

#include <algorithm>
#include <cmath>
#include <random>

#include "actions.hpp"
#include "local_episode.hpp"
#include "numbers.hpp"
#include "rlserve/limits.hpp"

namespace rlserve {
namespace {

NDArray int64_array(const std::vector<std::int64_t>& values, std::vector<std::uint32_t> shape) {
  NDArray a(DType::int64, std::move(shape));
  for (std::size_t i = 0; i < values.size(); ++i) a.set_int64(i, values[i]);
  return a;
}

std::uint32_t u32(std::size_t n) { return static_cast<std::uint32_t>(n); }

}  // namespace

LocalClient::LocalClient(LocalOptions options)
    : options_(std::move(options)), rng_(options_.seed != 0 ? options_.seed : std::random_device{}()) {
  options_.inference_mode = "local";
}

Result<std::unique_ptr<LocalClient>> LocalClient::connect(const std::string& address, LocalOptions options) {
  if (options.client_id.empty()) options.client_id = random_hex_id();
  if (options.policy_id.empty()) options.policy_id = "default";
  if (options.fragment_length == 0 || options.batch_steps == 0) {
    return make_error(ErrorCode::invalid_argument, "fragment_length and batch_steps must be at least 1");
  }
  std::unique_ptr<LocalClient> client(new LocalClient(std::move(options)));
  if (auto s = client->start(address); !s) return s.error();
  return client;
}

LocalClient::~LocalClient() { stop_threads(); }

Result<std::vector<float>> LocalClient::flat_observation(const Value& observation, const std::string& what) const {
  std::vector<float> flat;
  if (auto s = flatten(observation_space_, observation, flat, "observation"); !s) {
    return make_error(s.error().code, what + ": " + s.error().message);
  }
  return flat;
}

Result<Value> LocalClient::observation_value(const std::vector<float>& observation) const {
  return value_from_numbers(observation_space_, std::vector<double>(observation.begin(), observation.end()), "observation");
}

Result<Value> LocalClient::action_value(const std::vector<double>& numbers) const {
  return value_from_numbers(action_space_, numbers, "action");
}

Result<std::string> LocalClient::start_episode(const std::string& episode_id, bool training_enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string id = episode_id.empty() ? random_hex_id() : episode_id;
  if (id.size() > 128) return make_error(ErrorCode::invalid_argument, "an episode id has at most 128 characters");
  if (episodes_.count(id)) {
    return make_error(ErrorCode::episode_error, "episode '" + id + "' is already open; end it or pick another id");
  }
  auto episode = std::make_unique<Episode>();
  episode->training = training_enabled;
  episode->state.assign(policy_->model().state_size(), 0.0f);
  episode->state_in = episode->state;
  episodes_.emplace(id, std::move(episode));
  return id;
}

Result<ServerAction> LocalClient::get_action(const std::string& episode_id, const std::vector<float>& observation) {
  auto value = observation_value(observation);
  if (!value) return make_error(value.error().code, "get_action for episode '" + episode_id + "': " + value.error().message);
  return get_action(episode_id, *value);
}

Result<ServerAction> LocalClient::get_action(const std::string& episode_id, const Value& observation) {
  return step(episode_id, observation, nullptr, "get_action");
}

Status LocalClient::log_action(const std::string& episode_id, const Value& observation, const Value& action) {
  const std::string where = "log_action for episode '" + episode_id + "'";
  std::vector<float> checked;
  if (auto s = flatten(action_space_, action, checked, "action"); !s) return make_error(s.error().code, where + ": " + s.error().message);
  std::vector<double> row = action_of(action).values;  // the values; the row is each minus its column's start
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto& offsets = policy_->model().head().offsets;
    if (row.size() != offsets.size()) {
      return make_error(ErrorCode::bad_value, where + ": the action has " + std::to_string(row.size()) + " numbers, the policy " +
                                                  std::to_string(offsets.size()) + " columns");
    }
    for (std::size_t c = 0; c < row.size(); ++c) row[c] -= offsets[c];
  }
  auto r = step(episode_id, observation, &row, "log_action");
  if (!r) return r.error();
  return ok_status();
}

Result<ServerAction> LocalClient::step(const std::string& episode_id, const Value& observation,
                                       const std::vector<double>* logged, const char* call) {
  auto flat = flat_observation(observation, std::string(call) + " for episode '" + episode_id + "'");
  if (!flat) return flat.error();
  std::unique_lock<std::mutex> lock(mutex_);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    return make_error(ErrorCode::episode_error,
                      std::string(call) + ": episode '" + episode_id + "' is not open; call start_episode first");
  }
  Episode& e = *it->second;
  if (e.multi_agent) {
    return make_error(ErrorCode::episode_error, std::string(call) + ": episode '" + episode_id +
                                                    "' is a multi-agent episode; use get_agent_actions");
  }
  const bool cutting = e.training && e.steps() >= options_.fragment_length;
  if (cutting) cut(episode_id, e, *flat, false, false);
  auto action = act(e, *flat, logged);
  lock.unlock();
  if (cutting) changed_.notify_all();
  return action;
}

// Called with mutex_ held. A logged action (log_action) still runs the network: a policy with
// memory carries its state through every step.
Result<ServerAction> LocalClient::act(Episode& e, const std::vector<float>& flat, const std::vector<double>* logged) {
  const std::vector<float> state_before = e.state;
  auto action = policy_->compute_action(flat.data(), e.state.empty() ? nullptr : e.state.data(), options_.explore, rng_);
  if (!action) return action.error();
  if (e.training) {
    if (e.steps() == 0) e.state_in = state_before;
    e.obs.insert(e.obs.end(), flat.begin(), flat.end());
    const std::vector<double>& row = logged ? *logged : action->row;
    e.actions.insert(e.actions.end(), row.begin(), row.end());
    e.rewards.push_back(0.0f);
    e.logp.push_back(logged ? 0.0f : static_cast<float>(action->logp));
    e.chosen.push_back(logged == nullptr);
    e.infos.emplace_back();
    e.versions.push_back(static_cast<std::int64_t>(policy_->version()));
    ++counts_.steps_taken;
  }
  ++e.length;
  ServerAction out;
  out.values = action->env;
  auto value = value_from_numbers(action_space_, out.values, "action");
  if (!value) return value.error();
  out.value = std::move(*value);
  return out;
}

Status LocalClient::log_returns(const std::string& episode_id, double reward, const std::optional<Value>& info) {
  if (info && !info->is_nil() && info->as_map() == nullptr) {
    return make_error(ErrorCode::bad_value, "log_returns for episode '" + episode_id + "': info must be a map");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = episodes_.find(episode_id);
  if (it == episodes_.end()) {
    return make_error(ErrorCode::episode_error, "log_returns: episode '" + episode_id + "' is not open; call start_episode first");
  }
  Episode& e = *it->second;
  if (e.multi_agent) {
    return make_error(ErrorCode::episode_error, "log_returns: episode '" + episode_id +
                                                    "' is a multi-agent episode; use log_agent_returns");
  }
  const double total = (e.steps() > 0 ? e.rewards.back() : 0.0) + reward;
  if (!std::isfinite(reward) || !(std::fabs(total) <= kMaxAbsReward)) {
    return make_error(ErrorCode::bad_value, "log_returns for episode '" + episode_id + "': reward " + std::to_string(reward) +
                                                " is not finite or makes the step's reward leave -1e9..1e9");
  }
  if (e.steps() > 0) {
    e.rewards.back() = static_cast<float>(total);
    if (info && info->as_map()) {  // merged into the step's info, later keys replacing earlier ones
      Value& kept = e.infos.back();
      if (kept.is_nil()) kept = Value(Value::Map{});
      for (const auto& [key, value] : *info->as_map()) {
        auto& map = *kept.as_map();
        auto at = std::find_if(map.begin(), map.end(), [&](const auto& entry) { return entry.first == key; });
        if (at != map.end()) at->second = value;
        else map.emplace_back(key, value);
      }
      e.any_info = true;
    }
  }
  e.total_return += reward;
  return ok_status();
}

Status LocalClient::end_episode(const std::string& episode_id, const std::vector<float>& observation, bool truncated) {
  auto value = observation_value(observation);
  if (!value) return make_error(value.error().code, "end_episode for episode '" + episode_id + "': " + value.error().message);
  return end_episode(episode_id, *value, truncated);
}

Status LocalClient::end_episode(const std::string& episode_id, const Value& observation, bool truncated) {
  auto flat = flat_observation(observation, "end_episode for episode '" + episode_id + "'");
  if (!flat) return flat.error();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = episodes_.find(episode_id);
    if (it == episodes_.end()) {
      return make_error(ErrorCode::episode_error, "end_episode: episode '" + episode_id + "' is not open");
    }
    Episode& e = *it->second;
    if (e.multi_agent) {
      return make_error(ErrorCode::episode_error, "end_episode: episode '" + episode_id +
                                                      "' is a multi-agent episode; use end_agent_episode");
    }
    if (e.training && e.steps() > 0) cut(episode_id, e, *flat, !truncated, truncated);
    summarise(episode_id, e, truncated);
    episodes_.erase(it);
  }
  changed_.notify_all();
  return ok_status();
}

// Called with mutex_ held: the fragment of the episode's steps so far, `last_obs` its row T.
void LocalClient::cut(const std::string& id, Episode& e, const std::vector<float>& last_obs, bool terminated,
                      bool truncated) {
  const std::size_t t = e.steps(), d = observation_space_.flat_dim();
  std::vector<float> obs = std::move(e.obs);
  obs.insert(obs.end(), last_obs.begin(), last_obs.end());
  Value actions;
  if (action_space_.type == Space::Type::discrete) {
    std::vector<std::int64_t> choices;
    for (double a : e.actions) choices.push_back(static_cast<std::int64_t>(std::llround(a)));
    actions = Value(int64_array(choices, {u32(t)}));
  } else {
    std::vector<float> rows(e.actions.begin(), e.actions.end());
    actions = Value(NDArray::from_floats(rows.data(), {u32(t), u32(action_columns_)}));
  }
  NDArray chosen(DType::boolean, {u32(t)});
  for (std::size_t i = 0; i < t; ++i) chosen.set_int64(i, e.chosen[i] ? 1 : 0);
  Value::Map f{{"episode_id", id},
               {"obs", Value(NDArray::from_floats(obs.data(), {u32(t + 1), u32(d)}))},
               {"actions", std::move(actions)},
               {"rewards", Value(NDArray::from_floats(e.rewards.data(), {u32(t)}))},
               {"behaviour_logp", Value(NDArray::from_floats(e.logp.data(), {u32(t)}))},
               {"policy_chosen", Value(std::move(chosen))},
               {"weights_version", Value(int64_array(e.versions, {u32(t)}))},
               {"terminated", terminated},
               {"truncated", truncated}};
  if (!e.state_in.empty()) f.emplace_back("state_in", Value(NDArray::from_floats(e.state_in.data(), {u32(e.state_in.size())})));
  if (e.any_info) f.emplace_back("infos", Value(Value::Array(e.infos.begin(), e.infos.end())));
  ready_fragments_.push_back(Value(std::move(f)));
  ready_steps_.push_back(t);
  ready_total_ += t;
  e.obs.clear();
  e.actions.clear();
  e.rewards.clear();
  e.logp.clear();
  e.versions.clear();
  e.chosen.clear();
  e.infos.clear();
  e.any_info = false;
  e.state_in = e.state;
  form_batches(false);
  // Past the bound the oldest unsent batches go (the newest experience is worth more).
  std::uint64_t buffered = ready_total_;
  for (const auto& b : outbox_) buffered += b.steps;
  while (buffered > options_.max_buffered_steps && !outbox_.empty()) {
    buffered -= outbox_.front().steps;
    counts_.steps_dropped += outbox_.front().steps;
    outbox_.pop_front();
  }
}

std::uint64_t LocalClient::weights_version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return policy_->version();
}

LocalCounts LocalClient::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

std::uint64_t LocalClient::buffered_steps() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::uint64_t n = ready_total_ + in_flight_steps_;
  for (const auto& b : outbox_) n += b.steps;
  return n;
}

Space LocalClient::observation_space() const { return observation_space_; }

void LocalClient::drop_next_report_reply() {
  std::lock_guard<std::mutex> lock(mutex_);
  drop_next_reply_ = true;
}

}  // namespace rlserve
