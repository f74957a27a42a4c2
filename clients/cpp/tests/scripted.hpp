// A RandomSource that hands out given draws, to replay the protocol vectors' draws.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <deque>

#include "rlserve/random.hpp"

class Scripted final : public rlserve::RandomSource {
 public:
  std::deque<double> uniforms, normals;
  double uniform() override { return take(uniforms, "uniform"); }
  double normal() override { return take(normals, "normal"); }

 private:
  static double take(std::deque<double>& q, const char* what) {
    if (q.empty()) {
      std::fprintf(stderr, "the scripted source ran out of %s draws\n", what);
      std::abort();
    }
    const double v = q.front();
    q.pop_front();
    return v;
  }
};
