// A minimal check harness for the ctest programs: CHECK records a failure and goes on.
#pragma once

#include <cmath>
#include <cstdio>
#include <string>

namespace check {

inline int& failures() {
  static int n = 0;
  return n;
}

inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "%s:%d: FAILED: %s\n", file, line, what.c_str());
  ++failures();
}

/// numpy's allclose for one number: |got - want| <= atol + rtol * |want|.
inline bool near(double got, double want, double rtol, double atol) {
  return std::fabs(got - want) <= atol + rtol * std::fabs(want);
}

inline int finish(const char* name) {
  if (failures() == 0) std::printf("%s: all checks passed\n", name);
  else std::printf("%s: %d checks failed\n", name, failures());
  return failures() == 0 ? 0 : 1;
}

}  // namespace check

#define CHECK(cond, what)                                        \
  do {                                                           \
    if (!(cond)) check::fail(__FILE__, __LINE__, (what));        \
  } while (0)
