// The C ABI's client calls beyond one episode's steps (include/rlserve.h): sizes, log_action,
// info maps, batched and multi-agent calls; nothing is thrown.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "c_api_client.hpp"
#include "c_api_support.hpp"
#include "numbers.hpp"

using rlserve::c_api::fail;
using rlserve::c_api::guarded;
using rlserve::c_api::succeed;

namespace {

std::vector<float> floats(const float* data, std::size_t size) { return std::vector<float>(data, data + size); }

/// The ids of a C array into `out`; invalid_argument naming the first NULL.
rlserve_status read_ids(const char* const* ids, std::size_t count, const char* what, std::vector<std::string>& out) {
  if (count > 0 && ids == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, std::string(what) + " is NULL");
  for (std::size_t i = 0; i < count; ++i) {
    if (ids[i] == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, std::string(what) + "[" + std::to_string(i) + "] is NULL");
    out.emplace_back(ids[i]);
  }
  return RLSERVE_OK;
}

/// Copies the actions' numbers into `out` (packed; `sizes[i]` each, or one width for all in
/// `*width`); invalid_argument when `capacity` is too small, nothing written.
rlserve_status write_actions(const std::vector<const rlserve::ServerAction*>& actions, double* out,
                             std::size_t capacity, std::size_t* sizes, std::size_t* width) {
  std::size_t total = 0;
  for (const auto* a : actions) total += a->values.size();
  if (width != nullptr) *width = actions.empty() ? 0 : actions.front()->values.size();
  if (sizes != nullptr) {
    for (std::size_t i = 0; i < actions.size(); ++i) sizes[i] = actions[i]->values.size();
  }
  if (total > capacity || (out == nullptr && total > 0)) {
    return fail(RLSERVE_INVALID_ARGUMENT, "the actions have " + std::to_string(total) + " numbers; actions holds " +
                                              std::to_string(capacity));
  }
  for (const auto* a : actions) out = std::copy(a->values.begin(), a->values.end(), out);
  return succeed();
}

/// The agents' observations as values into `out` (each read with its agent's policy's space).
rlserve_status agent_observations(const rlserve_client& c, const std::vector<std::string>& agents,
                                  const float* observations, const std::size_t* sizes,
                                  std::map<std::string, rlserve::Value>& out) {
  if (!agents.empty() && (observations == nullptr || sizes == nullptr)) {
    return fail(RLSERVE_INVALID_ARGUMENT, "observations and observation_sizes must not be NULL");
  }
  std::size_t offset = 0;
  for (std::size_t i = 0; i < agents.size(); ++i) {
    const auto numbers = floats(observations + offset, sizes[i]);
    auto value = c.local ? c.local->observation_value(numbers) : c.client->agent_observation_value(agents[i], numbers);
    if (!value) return fail(value.error());
    offset += sizes[i];
    if (!out.emplace(agents[i], std::move(*value)).second) {
      return fail(RLSERVE_INVALID_ARGUMENT, "agent '" + agents[i] + "' is named twice");
    }
  }
  return RLSERVE_OK;
}

}  // namespace

extern "C" {

rlserve_status rlserve_client_sizes(const rlserve_client* c, size_t* observation_size, size_t* action_size) {
  return guarded([&] {
    if (c == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client is NULL");
    const rlserve::Space obs = c->local ? c->local->observation_space() : c->client->observation_space();
    const rlserve::Space act = c->local ? c->local->action_space() : c->client->action_space();
    if (observation_size != nullptr) *observation_size = rlserve::number_count(obs);
    if (action_size != nullptr) *action_size = rlserve::number_count(act);
    return succeed();
  });
}

rlserve_status rlserve_client_log_action(rlserve_client* c, const char* episode_id, const float* observation,
                                         size_t size, const double* action, size_t action_size) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    if ((observation == nullptr && size > 0) || (action == nullptr && action_size > 0)) {
      return fail(RLSERVE_INVALID_ARGUMENT, "observation or action is NULL");
    }
    const std::vector<double> numbers(action, action + action_size);
    const std::string where = "log_action for episode '" + std::string(episode_id) + "': ";
    if (c->local) {
      auto a = c->local->action_value(numbers);
      if (!a) return fail(static_cast<rlserve_status>(a.error().code), where + a.error().message);
      auto o = c->local->observation_value(floats(observation, size));
      if (!o) return fail(static_cast<rlserve_status>(o.error().code), where + o.error().message);
      auto s = c->local->log_action(episode_id, *o, *a);
      return s ? succeed() : fail(s.error());
    }
    auto a = c->client->action_value(numbers);
    if (!a) return fail(static_cast<rlserve_status>(a.error().code), where + a.error().message);
    auto o = c->client->observation_value(floats(observation, size));
    if (!o) return fail(static_cast<rlserve_status>(o.error().code), where + o.error().message);
    auto s = c->client->log_action(episode_id, *o, *a);
    return s ? succeed() : fail(s.error());
  });
}

rlserve_status rlserve_client_log_returns_info(rlserve_client* c, const char* episode_id, double reward,
                                               const char* const* keys, const double* values, size_t count) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    std::vector<std::string> names;
    if (auto st = read_ids(keys, count, "keys", names); st != RLSERVE_OK) return st;
    if (count > 0 && values == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "values is NULL");
    rlserve::Value::Map info;
    for (std::size_t i = 0; i < count; ++i) info.emplace_back(names[i], rlserve::Value(values[i]));
    const std::optional<rlserve::Value> value(rlserve::Value(std::move(info)));
    auto s = c->local ? c->local->log_returns(episode_id, reward, value) : c->client->log_returns(episode_id, reward, value);
    return s ? succeed() : fail(s.error());
  });
}

rlserve_status rlserve_client_get_actions(rlserve_client* c, size_t count, const char* const* episode_ids,
                                          const float* observations, size_t size, double* actions,
                                          size_t action_capacity, size_t* action_size) {
  return guarded([&] {
    if (c == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client is NULL");
    if (count == 0) return fail(RLSERVE_INVALID_ARGUMENT, "count is 0; pass at least one episode");
    std::vector<std::string> ids;
    if (auto st = read_ids(episode_ids, count, "episode_ids", ids); st != RLSERVE_OK) return st;
    if (observations == nullptr && size > 0) return fail(RLSERVE_INVALID_ARGUMENT, "observations is NULL");
    const std::size_t width = rlserve::number_count(c->local ? c->local->action_space() : c->client->action_space());
    if (action_size != nullptr) *action_size = width;
    if (count * width > action_capacity || actions == nullptr) {  // before anything is recorded
      return fail(RLSERVE_INVALID_ARGUMENT, "the actions have " + std::to_string(count * width) + " numbers; actions holds " +
                                                std::to_string(actions == nullptr ? 0 : action_capacity));
    }
    std::vector<rlserve::Value> values;
    for (std::size_t i = 0; i < count; ++i) {
      const auto numbers = floats(observations + i * size, size);
      auto v = c->local ? c->local->observation_value(numbers) : c->client->observation_value(numbers);
      if (!v) {
        return fail(static_cast<rlserve_status>(v.error().code),
                    "get_actions for episode '" + ids[i] + "': " + v.error().message);
      }
      values.push_back(std::move(*v));
    }
    std::vector<rlserve::ServerAction> got;
    if (c->local) {
      for (std::size_t i = 0; i < count; ++i) {
        auto a = c->local->get_action(ids[i], values[i]);
        if (!a) return fail(a.error());
        got.push_back(std::move(*a));
      }
    } else {
      auto a = c->client->get_actions(ids, values);
      if (!a) return fail(a.error());
      got = std::move(*a);
    }
    std::vector<const rlserve::ServerAction*> list;
    for (const auto& a : got) list.push_back(&a);
    return write_actions(list, actions, action_capacity, nullptr, action_size);
  });
}

rlserve_status rlserve_client_get_agent_actions(rlserve_client* c, const char* episode_id, size_t count,
                                                const char* const* agent_ids, const float* observations,
                                                const size_t* observation_sizes, double* actions,
                                                size_t action_capacity, size_t* action_sizes) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    if (count == 0) return fail(RLSERVE_INVALID_ARGUMENT, "count is 0; name at least one agent that acts");
    if (action_sizes == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "action_sizes is NULL (one entry per agent)");
    std::vector<std::string> agents;
    if (auto st = read_ids(agent_ids, count, "agent_ids", agents); st != RLSERVE_OK) return st;
    std::map<std::string, rlserve::Value> values;
    if (auto st = agent_observations(*c, agents, observations, observation_sizes, values); st != RLSERVE_OK) {
      return st;
    }
    auto got = c->local ? c->local->get_agent_actions(episode_id, values) : c->client->get_agent_actions(episode_id, values);
    if (!got) return fail(got.error());
    std::vector<const rlserve::ServerAction*> list;
    for (const auto& agent : agents) {
      auto it = got->find(agent);
      if (it == got->end()) return fail(RLSERVE_DECODE_ERROR, "the server sent no action for agent '" + agent + "'");
      list.push_back(&it->second);
    }
    return write_actions(list, actions, action_capacity, action_sizes, nullptr);
  });
}

rlserve_status rlserve_client_log_agent_returns(rlserve_client* c, const char* episode_id, size_t count,
                                                const char* const* agent_ids, const double* rewards, const int* done) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    std::vector<std::string> agents;
    if (auto st = read_ids(agent_ids, count, "agent_ids", agents); st != RLSERVE_OK) return st;
    if (count > 0 && rewards == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "rewards is NULL");
    std::map<std::string, double> amounts;
    std::map<std::string, bool> marks;
    for (std::size_t i = 0; i < count; ++i) {
      if (!amounts.emplace(agents[i], rewards[i]).second) {
        return fail(RLSERVE_INVALID_ARGUMENT, "agent '" + agents[i] + "' is named twice");
      }
      const int mark = done == nullptr ? RLSERVE_AGENT_ACTING : done[i];
      if (mark == RLSERVE_AGENT_TERMINATED || mark == RLSERVE_AGENT_TRUNCATED) {
        marks.emplace(agents[i], mark == RLSERVE_AGENT_TERMINATED);
      } else if (mark != RLSERVE_AGENT_ACTING) {
        return fail(RLSERVE_INVALID_ARGUMENT, "done[" + std::to_string(i) + "] is " + std::to_string(mark) +
                                                  "; use RLSERVE_AGENT_ACTING, _TERMINATED or _TRUNCATED");
      }
    }
    auto s = c->local ? c->local->log_agent_returns(episode_id, amounts, marks)
                      : c->client->log_agent_returns(episode_id, amounts, marks);
    return s ? succeed() : fail(s.error());
  });
}

rlserve_status rlserve_client_end_agent_episode(rlserve_client* c, const char* episode_id, size_t count,
                                                const char* const* agent_ids, const float* observations,
                                                const size_t* observation_sizes, int truncated) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    std::vector<std::string> agents;
    if (auto st = read_ids(agent_ids, count, "agent_ids", agents); st != RLSERVE_OK) return st;
    std::map<std::string, rlserve::Value> values;
    if (auto st = agent_observations(*c, agents, observations, observation_sizes, values); st != RLSERVE_OK) {
      return st;
    }
    auto s = c->local ? c->local->end_agent_episode(episode_id, values, truncated != 0)
                      : c->client->end_agent_episode(episode_id, values, truncated != 0);
    return s ? succeed() : fail(s.error());
  });
}

}  // extern "C"
