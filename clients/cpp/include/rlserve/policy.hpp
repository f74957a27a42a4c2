// A local-inference policy: one weights version's model and its action rule (section 14).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "rlserve/distributions.hpp"
#include "rlserve/error.hpp"
#include "rlserve/limits.hpp"
#include "rlserve/model.hpp"
#include "rlserve/value.hpp"

namespace rlserve {

/// One weights version of one policy. Cheap to copy (the model is shared and immutable), and
/// safe to use from several threads when each brings its own RandomSource.
class Policy {
 public:
  /// From a decoded `weights` reply (not an `unchanged` one).
  static Result<Policy> from_weights(const Value& weights_message);
  /// From the msgpack body of a `weights` reply (the frame without its 4-byte prefix).
  static Result<Policy> from_weights_body(const std::uint8_t* body, std::size_t size,
                                          const Limits& limits = Limits{});

  const Model& model() const noexcept { return *model_; }
  const std::string& policy_id() const noexcept { return policy_id_; }
  std::uint64_t version() const noexcept { return version_; }

  /// One action for one flattened observation (model().obs_dim() floats, which must be
  /// finite). `state` is the episode's recurrent state (model().state_size() floats, zeros at
  /// the episode's start), read and replaced by the state after the step; it may be null when
  /// state_size() is 0.
  Result<Action> compute_action(const float* observation, float* state, bool explore,
                                RandomSource& random) const;

 private:
  std::shared_ptr<const Model> model_;
  std::string policy_id_;
  std::uint64_t version_ = 0;
};

}  // namespace rlserve
