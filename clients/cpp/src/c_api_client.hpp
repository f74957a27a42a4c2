// The C ABI's network client handle (private): one of the two clients.
#pragma once

#include <memory>

#include "rlserve.h"
#include "rlserve/client.hpp"
#include "rlserve/local_client.hpp"

/// One of the two: `client` (remote inference) or `local`.
struct rlserve_client {
  std::unique_ptr<rlserve::Client> client;
  std::unique_ptr<rlserve::LocalClient> local;
};
