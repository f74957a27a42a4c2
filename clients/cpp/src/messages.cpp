#include "rlserve/messages.hpp"

namespace rlserve {
namespace {

constexpr const char* kNames[] = {
    "hello", "welcome", "start_episode", "episode_started", "get_action", "action",
    "log_action", "log_returns", "ok", "end_episode", "ping", "pong", "error", "get_weights",
    "weights", "report_samples", "samples_accepted", "map_agents", "agents_mapped",
};
constexpr int kCount = sizeof(kNames) / sizeof(kNames[0]);

Error field_error(const std::string& type, const char* field, const char* expected) {
  return make_error(ErrorCode::decode_error,
                    "'" + type + "' field '" + field + "' is missing or not " + expected);
}

}  // namespace

const char* message_type_name(MessageType type) noexcept {
  const int i = static_cast<int>(type);
  return i < kCount ? kNames[i] : "unknown";
}

MessageType message_type_from_name(std::string_view name) noexcept {
  for (int i = 0; i < kCount; ++i) {
    if (name == kNames[i]) return static_cast<MessageType>(i);
  }
  return MessageType::unknown;
}

Result<Envelope> read_envelope(const Value& message) {
  if (message.as_map() == nullptr) {
    return make_error(ErrorCode::decode_error, "a message must be a map");
  }
  const Value* type = message.present("type");
  if (type == nullptr || type->as_string() == nullptr) {
    return make_error(ErrorCode::decode_error, "a message needs a string 'type'");
  }
  Envelope env{message_type_from_name(*type->as_string()), *type->as_string(), std::nullopt};
  if (const Value* id = message.present("id")) {
    const auto n = id->as_uint();
    if (!n) {
      return make_error(ErrorCode::decode_error, "'id' must be an integer >= 0 or nil");
    }
    env.id = *n;
  }
  return env;
}

Value make_message(MessageType type, std::uint64_t id, Value::Map fields) {
  Value::Map m;
  m.reserve(fields.size() + 2);
  m.emplace_back("type", message_type_name(type));
  m.emplace_back("id", id);
  for (auto& [k, v] : fields) {
    if (!v.is_nil()) m.emplace_back(std::move(k), std::move(v));
  }
  return Value(std::move(m));
}

Result<ServerError> read_error(const Value& message) {
  auto env = read_envelope(message);
  if (!env) return env.error();
  if (env->type != MessageType::error) {
    return make_error(ErrorCode::decode_error, "expected an 'error' message, got '" + env->type_name + "'");
  }
  const Value* code = message.present("code");
  const Value* text = message.present("message");
  if (code == nullptr || code->as_string() == nullptr) return field_error("error", "code", "a string");
  ServerError e{env->id, *code->as_string(),
                text != nullptr && text->as_string() != nullptr ? *text->as_string() : ""};
  static const char* known[] = {"unauthorized", "version_mismatch", "episode_error", "capacity",
                                "bad_value", "unsupported_space", "decode_error", "limit_exceeded",
                                "frame_too_large", "timeout", "forbidden", "internal"};
  bool is_known = false;
  for (const char* k : known) is_known = is_known || e.code == k;
  if (!is_known) e.code = "decode_error";  // section 8: an unknown code reads as decode_error
  return e;
}

Result<Welcome> read_welcome(const Value& message) {
  auto env = read_envelope(message);
  if (!env) return env.error();
  if (env->type != MessageType::welcome) {
    return make_error(ErrorCode::decode_error, "expected 'welcome', got '" + env->type_name + "'");
  }
  Welcome w;
  const Value* version = message.present("protocol_version");
  if (version == nullptr || !version->as_int()) return field_error("welcome", "protocol_version", "an integer");
  w.protocol_version = *version->as_int();
  if (const Value* v = message.present("server_version"); v && v->as_string()) w.server_version = *v->as_string();
  if (const Value* v = message.present("instance_id"); v && v->as_string()) w.instance_id = *v->as_string();
  const Value* policies = message.present("policies");
  if (policies == nullptr || policies->as_map() == nullptr || policies->as_map()->empty()) {
    return field_error("welcome", "policies", "a map with at least one policy");
  }
  w.policies = *policies;
  if (const Value* m = message.present("mapping"); m && m->as_array()) {
    for (const Value& rule : *m->as_array()) {
      const auto* pair = rule.as_array();
      if (pair == nullptr || pair->size() != 2 || !(*pair)[0].as_string() || !(*pair)[1].as_string()) {
        return field_error("welcome", "mapping", "a list of [string, string] rules");
      }
      w.mapping.emplace_back(*(*pair)[0].as_string(), *(*pair)[1].as_string());
    }
  }
  if (const Value* v = message.present("multi_agent"); v && v->as_bool()) w.multi_agent = *v->as_bool();
  if (const Value* v = message.present("map_agents"); v && v->as_bool()) w.map_agents = *v->as_bool();
  if (const Value* m = message.present("inference_modes"); m && m->as_array()) {
    for (const Value& mode : *m->as_array()) {
      if (mode.as_string()) w.inference_modes.push_back(*mode.as_string());
    }
  }
  if (const Value* l = message.present("limits"); l && l->as_map()) w.limits = Limits{}.updated_from(*l);
  return w;
}

Result<WeightsReply> read_weights(const Value& message) {
  auto env = read_envelope(message);
  if (!env) return env.error();
  if (env->type != MessageType::weights) {
    return make_error(ErrorCode::decode_error, "expected 'weights', got '" + env->type_name + "'");
  }
  WeightsReply r;
  const Value* policy = message.present("policy_id");
  if (policy == nullptr || policy->as_string() == nullptr) return field_error("weights", "policy_id", "a string");
  r.policy_id = *policy->as_string();
  const Value* version = message.present("version");
  if (version == nullptr || !version->as_uint()) return field_error("weights", "version", "an integer >= 0");
  r.version = *version->as_uint();
  const Value* unchanged = message.present("unchanged");
  if (unchanged == nullptr || !unchanged->as_bool()) return field_error("weights", "unchanged", "a boolean");
  r.unchanged = *unchanged->as_bool();
  if (!r.unchanged) {
    const Value* model = message.present("model");
    const Value* arrays = message.present("arrays");
    if (model == nullptr || model->as_map() == nullptr) return field_error("weights", "model", "a map");
    if (arrays == nullptr || arrays->as_map() == nullptr) return field_error("weights", "arrays", "a map");
    r.model = *model;
    r.arrays = *arrays;
  }
  return r;
}

}  // namespace rlserve
