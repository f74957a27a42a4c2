#include "rlserve/policy.hpp"

#include <cmath>
#include <string>

#include "rlserve/codec.hpp"
#include "rlserve/messages.hpp"

namespace rlserve {

Result<Policy> Policy::from_weights(const Value& weights_message) {
  auto reply = read_weights(weights_message);
  if (!reply) return reply.error();
  if (reply->unchanged) {
    return make_error(ErrorCode::invalid_argument,
                      "this 'weights' reply is 'unchanged' and carries no model; build the policy "
                      "from a full reply (get_weights without have_version)");
  }
  auto model = Model::parse(reply->model, reply->arrays);
  if (!model) return model.error();
  Policy p;
  p.model_ = std::make_shared<const Model>(std::move(model).value());
  p.policy_id_ = reply->policy_id;
  p.version_ = reply->version;
  return p;
}

Result<Policy> Policy::from_weights_body(const std::uint8_t* body, std::size_t size, const Limits& limits) {
  auto message = decode_body(body, size, limits);
  if (!message) return message.error();
  return from_weights(*message);
}

Result<Action> Policy::compute_action(const float* observation, float* state, bool explore,
                                      RandomSource& random) const {
  const Model& m = *model_;
  if (observation == nullptr) return make_error(ErrorCode::invalid_argument, "observation is null");
  if (m.state_size() > 0 && state == nullptr) {
    return make_error(ErrorCode::invalid_argument,
                      "this policy has memory: pass its state (" + std::to_string(m.state_size()) +
                          " floats, zeros at an episode's start)");
  }
  for (std::size_t i = 0; i < m.obs_dim(); ++i) {
    if (!std::isfinite(observation[i])) {
      return make_error(ErrorCode::bad_value, "observation value at flat index " + std::to_string(i) +
                                                  " is not finite; send finite float32 values");
    }
  }
  std::vector<float> y;
  std::vector<std::uint8_t> legal;
  std::vector<float> next_state(m.state_size());
  m.forward(observation, state, next_state.data(), y, legal);
  auto action = choose_action(m.head(), y, legal, explore, random);
  if (!action) return action;  // the state is left as it was
  if (!next_state.empty()) std::copy(next_state.begin(), next_state.end(), state);
  return action;
}

}  // namespace rlserve
