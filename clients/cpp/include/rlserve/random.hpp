// Random draws for sampling actions.
#pragma once

#include <cstdint>

namespace rlserve {

/// Where a distribution takes its draws from. Any good generator will do (section 14.4: the
/// draws need not match the server's).
class RandomSource {
 public:
  virtual ~RandomSource() = default;
  /// A uniform draw from [0, 1).
  virtual double uniform() = 0;
  /// A draw from the standard normal distribution.
  virtual double normal() = 0;
};

/// A seeded generator (xoshiro256**, seeded through splitmix64; normals by Box-Muller), giving
/// the same draws for the same seed on every platform.
class Rng final : public RandomSource {
 public:
  explicit Rng(std::uint64_t seed) noexcept;
  double uniform() noexcept override;
  double normal() noexcept override;
  /// The next 64 random bits.
  std::uint64_t next() noexcept;

 private:
  std::uint64_t s_[4];
  bool has_spare_ = false;
  double spare_ = 0.0;
};

}  // namespace rlserve
