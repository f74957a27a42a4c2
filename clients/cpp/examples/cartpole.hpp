// CartPole-v1 in C++: the physics of Gymnasium's CartPole-v1 (Euler integration, a 500-step
// time limit), as an engine-side simulator for the examples and the tests.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <random>

namespace cartpole {

/// One CartPole: state (x, x_dot, theta, theta_dot); action 0 pushes left, 1 right.
class CartPole {
 public:
  static constexpr double kGravity = 9.8, kMassCart = 1.0, kMassPole = 0.1, kLength = 0.5;
  static constexpr double kForce = 10.0, kTau = 0.02, kXLimit = 2.4;
  static constexpr double kThetaLimit = 12.0 * 2.0 * 3.14159265358979323846 / 360.0;
  static constexpr int kMaxSteps = 500;

  explicit CartPole(std::uint64_t seed) : rng_(seed) {}

  /// A new episode: every state variable uniform in [-0.05, 0.05]; the first observation.
  std::array<float, 4> reset() {
    std::uniform_real_distribution<double> u(-0.05, 0.05);
    for (double& s : state_) s = u(rng_);
    steps_ = 0;
    return observation();
  }

  /// Applies `action`; the reward is 1 for every step, the last included.
  struct Step {
    std::array<float, 4> observation;
    double reward;
    bool terminated;  ///< the pole fell or the cart left the track
    bool truncated;   ///< the 500-step time limit
  };
  Step step(int action) {
    const double total_mass = kMassCart + kMassPole, pole_mass_length = kMassPole * kLength;
    const double force = action == 1 ? kForce : -kForce;
    auto& [x, x_dot, theta, theta_dot] = state_;
    const double cos_t = std::cos(theta), sin_t = std::sin(theta);
    const double temp = (force + pole_mass_length * theta_dot * theta_dot * sin_t) / total_mass;
    const double theta_acc =
        (kGravity * sin_t - cos_t * temp) / (kLength * (4.0 / 3.0 - kMassPole * cos_t * cos_t / total_mass));
    const double x_acc = temp - pole_mass_length * theta_acc * cos_t / total_mass;
    x += kTau * x_dot;
    x_dot += kTau * x_acc;
    theta += kTau * theta_dot;
    theta_dot += kTau * theta_acc;
    ++steps_;
    const bool terminated = x < -kXLimit || x > kXLimit || theta < -kThetaLimit || theta > kThetaLimit;
    return {observation(), 1.0, terminated, !terminated && steps_ >= kMaxSteps};
  }

  std::array<float, 4> observation() const {
    return {static_cast<float>(state_[0]), static_cast<float>(state_[1]), static_cast<float>(state_[2]),
            static_cast<float>(state_[3])};
  }

 private:
  std::mt19937_64 rng_;
  std::array<double, 4> state_{};
  int steps_ = 0;
};

}  // namespace cartpole
