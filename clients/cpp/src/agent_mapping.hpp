// The agent -> policy mapping of a welcome (docs/protocol.md section 15.2), private to the library.
#pragma once

#include <string>

#include "rlserve/messages.hpp"

namespace rlserve {

/// The policy `agent` acts for by `welcome.mapping`: an exact id, then the first matching
/// shell-style pattern, then the only policy when there are no rules; bad_value naming the fix
/// when nothing maps it.
Result<std::string> map_agent(const Welcome& welcome, const std::string& agent);

}  // namespace rlserve
