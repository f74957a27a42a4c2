// What every C ABI entry point shares (private): the per-thread last error and the guard that
// turns an exception into a status.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "rlserve.h"
#include "rlserve/error.hpp"

namespace rlserve::c_api {

/// This thread's last error message.
std::string& last_error();

/// Records `message` and returns `status`.
inline rlserve_status fail(rlserve_status status, std::string message) {
  last_error() = std::move(message);
  return status;
}

/// Records an Error (its code is the status of the same number).
inline rlserve_status fail(const Error& e) { return fail(static_cast<rlserve_status>(e.code), e.message); }

/// Clears the last error; RLSERVE_OK.
inline rlserve_status succeed() {
  last_error().clear();
  return RLSERVE_OK;
}

/// Runs `f`, turning anything thrown into RLSERVE_INTERNAL with a message.
template <class F>
rlserve_status guarded(F&& f) noexcept {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return fail(RLSERVE_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(RLSERVE_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(RLSERVE_INTERNAL, "internal error");
  }
}

}  // namespace rlserve::c_api
