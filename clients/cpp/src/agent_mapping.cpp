// The agent -> policy mapping of a welcome.
#include "agent_mapping.hpp"

#include <fnmatch.h>

namespace rlserve {
namespace {

bool is_pattern(const std::string& rule) { return rule.find_first_of("*?[") != std::string::npos; }

}  // namespace

Result<std::string> map_agent(const Welcome& w, const std::string& agent) {
  for (const auto& [rule, policy] : w.mapping) {
    if (!is_pattern(rule) && rule == agent) return policy;
  }
  for (const auto& [rule, policy] : w.mapping) {  // shell-style, no escape character (section 15.2)
    if (is_pattern(rule) && ::fnmatch(rule.c_str(), agent.c_str(), FNM_NOESCAPE) == 0) return policy;
  }
  const auto* policies = w.policies.as_map();
  if (w.mapping.empty() && policies != nullptr && policies->size() == 1) return policies->front().first;
  return make_error(ErrorCode::bad_value, "agent '" + agent + "' maps to no policy by the server's mapping rules" +
                                              (w.map_agents ? " (the server's mapping function decides it)" : std::string()) +
                                              "; pass its observation as a Value (get_agent_actions), or add a rule "
                                              "for it to the server's [mapping] table");
}

}  // namespace rlserve
