// The C ABI (include/rlserve.h) over the C++ library; every entry point catches everything.
#include "rlserve.h"

#include "c_api_support.hpp"

#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "rlserve/messages.hpp"
#include "rlserve/policy.hpp"
#include "rlserve/random.hpp"

struct rlserve_policy {
  rlserve::Policy policy;
  rlserve::Rng rng;
  std::mutex lock;
};

namespace rlserve::c_api {

std::string& last_error() {
  thread_local std::string message;
  return message;
}

}  // namespace rlserve::c_api

using rlserve::c_api::fail;
using rlserve::c_api::guarded;
using rlserve::c_api::succeed;

extern "C" {

const char* rlserve_last_error(void) { return rlserve::c_api::last_error().c_str(); }

const char* rlserve_status_name(rlserve_status status) {
  if (status == RLSERVE_OK) return "ok";
  if (status < RLSERVE_OK || status > RLSERVE_TLS_ERROR) return "unknown";
  return rlserve::error_code_name(static_cast<rlserve::ErrorCode>(status));
}

int rlserve_protocol_version(void) { return rlserve::kProtocolVersion; }

rlserve_status rlserve_policy_create(const uint8_t* weights_body, size_t size, uint64_t seed,
                                     rlserve_policy** out) {
  return guarded([&] {
    if (out == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "out is NULL");
    *out = nullptr;
    if (weights_body == nullptr && size > 0) return fail(RLSERVE_INVALID_ARGUMENT, "weights_body is NULL");
    auto policy = rlserve::Policy::from_weights_body(weights_body, size);
    if (!policy) return fail(policy.error());
    *out = new rlserve_policy{std::move(policy).value(), rlserve::Rng(seed), {}};
    return succeed();
  });
}

void rlserve_policy_destroy(rlserve_policy* policy) { delete policy; }

size_t rlserve_policy_obs_dim(const rlserve_policy* p) { return p ? p->policy.model().obs_dim() : 0; }
size_t rlserve_policy_action_columns(const rlserve_policy* p) { return p ? p->policy.model().head().columns() : 0; }
size_t rlserve_policy_state_size(const rlserve_policy* p) { return p ? p->policy.model().state_size() : 0; }
uint64_t rlserve_policy_version(const rlserve_policy* p) { return p ? p->policy.version() : 0; }

rlserve_status rlserve_policy_compute_actions(rlserve_policy* p, size_t count, const float* observations,
                                              float* states, int explore, double* actions, double* rows,
                                              double* logps) {
  return guarded([&] {
    if (p == nullptr) return fail(RLSERVE_INVALID_ARGUMENT, "policy is NULL");
    if (count > 0 && (observations == nullptr || actions == nullptr)) {
      return fail(RLSERVE_INVALID_ARGUMENT, "observations and actions must not be NULL");
    }
    const rlserve::Model& m = p->policy.model();
    const size_t obs_dim = m.obs_dim(), state = m.state_size(), cols = m.head().columns();
    if (state > 0 && count > 0 && states == nullptr) {
      return fail(RLSERVE_INVALID_ARGUMENT, "this policy has memory: pass states (" + std::to_string(state) +
                                                " floats per observation, zeros at an episode's start)");
    }
    std::vector<float> new_states(states ? count * state : 0);
    if (states) std::copy(states, states + count * state, new_states.begin());
    std::vector<rlserve::Action> out;
    out.reserve(count);
    {
      std::lock_guard<std::mutex> hold(p->lock);
      for (size_t i = 0; i < count; ++i) {
        auto a = p->policy.compute_action(observations + i * obs_dim,
                                          state ? new_states.data() + i * state : nullptr,
                                          explore != 0, p->rng);
        if (!a) {
          return fail(static_cast<rlserve_status>(a.error().code),
                      "observation " + std::to_string(i) + ": " + a.error().message);
        }
        out.push_back(std::move(a).value());
      }
    }
    for (size_t i = 0; i < count; ++i) {
      for (size_t c = 0; c < cols; ++c) {
        actions[i * cols + c] = out[i].env[c];
        if (rows) rows[i * cols + c] = out[i].row[c];
      }
      if (logps) logps[i] = out[i].logp;
    }
    if (states) std::copy(new_states.begin(), new_states.end(), states);
    return succeed();
  });
}

}  // extern "C"
