// The request builders give exactly the bytes of messages.json's request vectors.
#include <cstdio>
#include <map>
#include <string>

#include "check.hpp"
#include "rlserve/codec.hpp"
#include "rlserve/requests.hpp"
#include "vectors.hpp"

using rlserve::Value;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: test_requests <docs/protocol-vectors/messages.json>\n");
    return 2;
  }
  const auto file = vectors::load(argv[1]);
  std::map<std::string, std::vector<std::uint8_t>> bytes;
  std::map<std::string, Value> values;
  for (const auto& v : file.at("vectors")) {
    bytes[v.at("name").get<std::string>()] = vectors::from_hex(v.at("msgpack").get<std::string>());
    values[v.at("name").get<std::string>()] = vectors::from_tagged(v.at("value"));
  }
  const Value obs = *values["get_action"].find("observation");
  const Value batch = *values["get_action_batched"].find("observations");
  rlserve::Hello h;
  h.client_name = "doc-example";
  rlserve::Hello local;
  local.inference_mode = "local";
  local.map_agents = true;
  rlserve::StepExtras reward_1, reward_half;
  reward_1.reward = 1.0;
  reward_half.reward = 0.5;
  const std::pair<const char*, Value> built[] = {
      {"hello", rlserve::hello_request(1, h)},
      {"hello_map_agents", rlserve::hello_request(1, local)},
      {"start_episode", rlserve::start_episode_request(2, "ep-1")},
      {"get_action", rlserve::get_action_request(3, "ep-1", obs)},
      {"get_action_reward", rlserve::get_action_request(4, "ep-1", obs, reward_1)},
      {"get_action_batched", rlserve::get_action_batch_request(12, {"ep-2", "ep-3"}, batch, std::vector<double>{0.0, 0.0})},
      {"log_action", rlserve::log_action_request(6, "ep-1", obs, 1, reward_half)},
      {"log_returns", rlserve::log_returns_request(5, "ep-1", 0.5)},
      {"end_episode", rlserve::end_episode_request(7, "ep-1", obs, false, reward_1)},
      {"ping", rlserve::ping_request(8)},
      {"get_weights", rlserve::get_weights_request(2)},
      {"get_weights_have", rlserve::get_weights_request(3, "default", 0)},
  };
  for (const auto& [name, message] : built) {
    CHECK(bytes.count(name) == 1, std::string(name) + ": no such vector");
    CHECK(rlserve::encode(message) == bytes[name], std::string(name) + ": the builder's bytes differ from the vector's");
  }
  return check::finish("test_requests");
}
