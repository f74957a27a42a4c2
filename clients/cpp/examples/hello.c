/* hello.c: one CartPole-like episode through the C ABI (remote inference). A toy physics keeps
 * it short: the pole's angle drifts with the push; the server chooses every push.
 * Usage: [RLSERVE_TOKEN=...] hello_c [host:port] */
#include <stdio.h>
#include <stdlib.h>

#include "rlserve.h"

int main(int argc, char** argv) {
  rlserve_client* client = NULL;
  char episode[129];
  float obs[4] = {0.0f, 0.0f, 0.01f, 0.0f};
  double action[1];
  size_t n = 0;
  double total = 0.0;
  int step;
  if (rlserve_client_connect(argc > 1 ? argv[1] : "127.0.0.1:9900", getenv("RLSERVE_TOKEN"), "remote", NULL, &client) != RLSERVE_OK ||
      rlserve_client_start_episode(client, NULL, 1, episode, sizeof episode) != RLSERVE_OK) {
    fprintf(stderr, "rlserve: %s\n", rlserve_last_error());
    rlserve_client_close(client);
    return 1;
  }
  for (step = 0; step < 500; ++step) {
    if (rlserve_client_get_action(client, episode, obs, 4, action, 1, &n) != RLSERVE_OK) {
      fprintf(stderr, "rlserve: %s\n", rlserve_last_error());
      rlserve_client_close(client);
      return 1;
    }
    obs[3] += action[0] == 1.0 ? 0.05f : -0.05f; /* the push turns the pole */
    obs[2] += 0.02f * obs[3];
    total += 1.0;
    rlserve_client_log_returns(client, episode, 1.0);
    if (obs[2] > 0.2f || obs[2] < -0.2f) break;
  }
  if (rlserve_client_end_episode(client, episode, obs, 4, step >= 500) != RLSERVE_OK) {
    fprintf(stderr, "rlserve: %s\n", rlserve_last_error());
    rlserve_client_close(client);
    return 1;
  }
  if (rlserve_client_close(client) != RLSERVE_OK) { /* the pipelined end_episode's reply */
    fprintf(stderr, "rlserve: %s\n", rlserve_last_error());
    return 1;
  }
  printf("episode return: %.0f\n", total);
  return 0;
}
