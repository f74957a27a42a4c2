// hello: one CartPole episode with remote inference (the server chooses every action).
// Usage: [RLSERVE_TOKEN=...] hello [host:port]   (first: rlserve serve --spaces-from CartPole-v1)
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cartpole.hpp"
#include "rlserve/client.hpp"

int main(int argc, char** argv) {
  rlserve::ClientOptions options;
  if (const char* token = std::getenv("RLSERVE_TOKEN")) options.token = token;
  auto client = rlserve::Client::connect(argc > 1 ? argv[1] : "127.0.0.1:9900", options);
  if (!client) {
    std::fprintf(stderr, "cannot connect: %s\n", client.error().message.c_str());
    return 1;
  }
  cartpole::CartPole env(/*seed=*/1);
  auto obs = env.reset();
  auto episode = (*client)->start_episode();
  if (!episode) return std::fprintf(stderr, "%s\n", episode.error().message.c_str()), 1;
  double total = 0;
  for (;;) {
    auto action = (*client)->get_action(*episode, std::vector<float>(obs.begin(), obs.end()));
    if (!action) return std::fprintf(stderr, "%s\n", action.error().message.c_str()), 1;
    auto step = env.step(static_cast<int>(action->discrete()));
    total += step.reward;
    obs = step.observation;
    (*client)->log_returns(*episode, step.reward);  // travels with the next call
    if (step.terminated || step.truncated) {
      (*client)->end_episode(*episode, std::vector<float>(obs.begin(), obs.end()), step.truncated);
      break;
    }
  }
  std::printf("episode return: %.0f\n", total);
  return (*client)->close() ? 0 : 1;
}
