// The C ABI of the network client (include/rlserve.h, rlserve_client_*); nothing is thrown.
#include <cstring>
#include <new>
#include <string>

#include "c_api_client.hpp"
#include "c_api_support.hpp"
#include "rlserve.h"
#include "rlserve/client.hpp"
#include "rlserve/local_client.hpp"


using rlserve::c_api::fail;
using rlserve::c_api::guarded;
using rlserve::c_api::succeed;

namespace {

std::string text(const char* s) { return s == nullptr ? std::string() : std::string(s); }

}  // namespace

extern "C" {

rlserve_status rlserve_client_connect(const char* address, const char* token, const char* inference_mode,
                                      const rlserve_client_options* options, rlserve_client** out) {
  return guarded([&] {
    if (out == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (address == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "address is NULL; pass \"host:port\"");
    const std::string mode = inference_mode == nullptr ? "remote" : inference_mode;
    if (mode != "remote" && mode != "local") {
      return fail(RLSERVE_INVALID_ARGUMENT, "inference_mode '" + mode + "' is unknown; pass \"remote\" (or NULL) or \"local\"");
    }
    rlserve::LocalOptions o;
    o.token = text(token);
    if (options != nullptr) {
      if (options->client_name) o.client_name = options->client_name;
      o.client_id = text(options->client_id);
      o.tls_ca = text(options->tls_ca);
      if (options->connect_timeout > 0) o.timeouts.connect = options->connect_timeout;
      if (options->request_timeout > 0) o.timeouts.request = options->request_timeout;
      if (options->reconnect_timeout > 0) o.timeouts.reconnect = options->reconnect_timeout;
      o.check_observations = options->no_observation_check == 0;
    }
    if (mode == "local") {
      auto local = rlserve::LocalClient::connect(address, std::move(o));
      if (!local) return fail(local.error());
      *out = new rlserve_client{nullptr, std::move(*local)};
      return succeed();
    }
    auto client = rlserve::Client::connect(address, std::move(o));
    if (!client) return fail(client.error());
    *out = new rlserve_client{std::move(*client), nullptr};
    return succeed();
  });
}

rlserve_status rlserve_client_start_episode(rlserve_client* c, const char* episode_id, int training_enabled,
                                            char* id_out, size_t id_capacity) {
  return guarded([&] {
    if (c == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client is NULL");
    auto id = c->local ? c->local->start_episode(text(episode_id), training_enabled != 0)
                       : c->client->start_episode(text(episode_id), training_enabled != 0);
    if (!id) return fail(id.error());
    if (id_out != nullptr) {
      if (id->size() + 1 > id_capacity) {
        return fail(RLSERVE_INVALID_ARGUMENT, "id_out holds " + std::to_string(id_capacity) + " bytes; the id '" + *id +
                                                  "' needs " + std::to_string(id->size() + 1) + " (129 always suffice)");
      }
      std::memcpy(id_out, id->c_str(), id->size() + 1);
    }
    return succeed();
  });
}

rlserve_status rlserve_client_get_action(rlserve_client* c, const char* episode_id, const float* observation,
                                         size_t size, double* action, size_t action_capacity, size_t* action_size) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    if (observation == nullptr && size > 0) return fail(RLSERVE_INVALID_ARGUMENT, "observation is NULL");
    const std::vector<float> obs(observation, observation + size);
    auto a = c->local ? c->local->get_action(episode_id, obs) : c->client->get_action(episode_id, obs);
    if (!a) return fail(a.error());
    if (action_size != nullptr) *action_size = a->values.size();
    if (a->values.size() > action_capacity || (action == nullptr && !a->values.empty())) {
      return fail(RLSERVE_INVALID_ARGUMENT, "the action has " + std::to_string(a->values.size()) +
                                                " numbers; action holds " + std::to_string(action_capacity));
    }
    std::copy(a->values.begin(), a->values.end(), action);
    return succeed();
  });
}

rlserve_status rlserve_client_log_returns(rlserve_client* c, const char* episode_id, double reward) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    auto s = c->local ? c->local->log_returns(episode_id, reward) : c->client->log_returns(episode_id, reward);
    return s ? succeed() : fail(s.error());
  });
}

rlserve_status rlserve_client_end_episode(rlserve_client* c, const char* episode_id, const float* observation,
                                          size_t size, int truncated) {
  return guarded([&] {
    if (c == nullptr || episode_id == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "client or episode_id is NULL");
    if (observation == nullptr && size > 0) return fail(RLSERVE_INVALID_ARGUMENT, "observation is NULL");
    const std::vector<float> obs(observation, observation + size);
    auto s = c->local ? c->local->end_episode(episode_id, obs, truncated != 0)
                      : c->client->end_episode(episode_id, obs, truncated != 0);
    return s ? succeed() : fail(s.error());
  });
}

int rlserve_client_reconnects(const rlserve_client* c) {
  return c == nullptr || c->local ? 0 : c->client->reconnects();
}

rlserve_status rlserve_client_close(rlserve_client* c) {
  return guarded([&] {
    if (c == nullptr) return succeed();
    std::unique_ptr<rlserve_client> owned(c);
    auto s = owned->local ? owned->local->close() : owned->client->close();
    return s ? succeed() : fail(s.error());
  });
}

}  // extern "C"
