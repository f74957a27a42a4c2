/* The C ABI's client calls from C against a real CartPole server (run by test_e2e_remote and
 * test_e2e_local, which check the server's metrics): sizes, log_action (off-policy) and info,
 * batched get_actions for two episodes and a multi-agent episode with a done mark. Prints
 * "steps: N" (the steps recorded, the agents' included) on success.
 * Usage: [RLSERVE_TOKEN=...] c_abi_episodes <host:port> <remote|local> */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlserve.h"

static int failures = 0;
#define CHECK(cond, what)                                                                       \
  do {                                                                                          \
    if (!(cond)) {                                                                              \
      fprintf(stderr, "%s:%d: FAILED: %s (last error: %s)\n", __FILE__, __LINE__, (what),       \
              rlserve_last_error());                                                            \
      ++failures;                                                                               \
    }                                                                                           \
  } while (0)

int main(int argc, char** argv) {
  rlserve_client* client = NULL;
  char first[129], second[129], multi[129];
  const char* pair[2];
  const char* agents[2] = {"a", "b"};
  const char* keys[2] = {"distance", "fuel"};
  const double info_values[2] = {2.5, -1.0};
  float obs[4] = {0.01f, -0.02f, 0.03f, 0.04f};
  float two[8] = {0.01f, 0.0f, 0.02f, 0.0f, -0.01f, 0.0f, -0.02f, 0.0f};
  double action[4], actions[8], logged = 1.0, bad_choice = 5.0, rewards[2] = {1.0, 0.5};
  size_t n = 0, obs_size = 0, action_size = 0, sizes[2] = {4, 4}, action_sizes[2] = {0, 0};
  int done[2] = {RLSERVE_AGENT_ACTING, RLSERVE_AGENT_TERMINATED}, t, steps = 0;
  rlserve_status st;

  if (argc < 3) {
    fprintf(stderr, "usage: c_abi_episodes <host:port> <remote|local>\n");
    return 2;
  }
  st = rlserve_client_connect(argv[1], getenv("RLSERVE_TOKEN"), argv[2], NULL, &client);
  if (st != RLSERVE_OK) {
    fprintf(stderr, "connect: %s\n", rlserve_last_error());
    return 1;
  }
  CHECK(rlserve_client_sizes(client, &obs_size, &action_size) == RLSERVE_OK, "sizes");
  CHECK(obs_size == 4 && action_size == 1, "CartPole: 4 observation numbers, 1 action number");

  /* One episode: an action served, one logged (off-policy), an info map, refusals that leave the
   * episode going. */
  CHECK(rlserve_client_start_episode(client, NULL, 1, first, sizeof first) == RLSERVE_OK, "start");
  CHECK(rlserve_client_get_action(client, first, obs, 4, action, 4, &n) == RLSERVE_OK && n == 1, "get_action");
  CHECK(rlserve_client_log_returns_info(client, first, 1.0, keys, info_values, 2) == RLSERVE_OK, "log_returns with info");
  CHECK(rlserve_client_log_action(client, first, obs, 4, &logged, 1) == RLSERVE_OK, "log_action");
  CHECK(rlserve_client_log_returns(client, first, 1.0) == RLSERVE_OK, "log_returns");
  st = rlserve_client_log_action(client, first, obs, 4, &bad_choice, 1);
  CHECK(st == RLSERVE_BAD_VALUE, "a Discrete(2) action of 5 is bad_value");
  CHECK(strstr(rlserve_last_error(), "outside Discrete(2") != NULL, "the message names the space");
  st = rlserve_client_log_action(client, first, obs, 4, rewards, 2);
  CHECK(st == RLSERVE_BAD_VALUE && strstr(rlserve_last_error(), "expected 1") != NULL, "two numbers for Discrete(2)");
  st = rlserve_client_log_returns_info(client, first, 0.0, keys, NULL, 2);
  CHECK(st == RLSERVE_INVALID_ARGUMENT, "info values NULL");
  CHECK(rlserve_client_end_episode(client, first, obs, 4, 0) == RLSERVE_OK, "end");
  steps += 2;

  /* Batched: two episodes, one call per step. */
  CHECK(rlserve_client_start_episode(client, NULL, 1, first, sizeof first) == RLSERVE_OK, "start 1");
  CHECK(rlserve_client_start_episode(client, NULL, 1, second, sizeof second) == RLSERVE_OK, "start 2");
  pair[0] = first;
  pair[1] = second;
  for (t = 0; t < 3; ++t) {
    n = 0;
    st = rlserve_client_get_actions(client, 2, pair, two, 4, actions, 8, &n);
    CHECK(st == RLSERVE_OK && n == 1, "batched get_actions: one number per episode");
    CHECK((actions[0] == 0.0 || actions[0] == 1.0) && (actions[1] == 0.0 || actions[1] == 1.0), "Discrete(2) actions");
    rlserve_client_log_returns(client, first, 1.0);
    rlserve_client_log_returns(client, second, 1.0);
    steps += 2;
  }
  st = rlserve_client_get_actions(client, 2, pair, two, 4, actions, 1, &n);
  CHECK(st == RLSERVE_INVALID_ARGUMENT && strstr(rlserve_last_error(), "holds 1") != NULL,
        "too small a buffer: refused before anything is sent");
  CHECK(rlserve_client_get_actions(client, 2, pair, two, 3, actions, 8, &n) == RLSERVE_BAD_VALUE, "3 numbers a Box(4,)");
  CHECK(rlserve_client_end_episode(client, first, obs, 4, 1) == RLSERVE_OK, "end 1");
  CHECK(rlserve_client_end_episode(client, second, obs, 4, 0) == RLSERVE_OK, "end 2");

  /* Multi-agent: two agents act, b terminates, a acts on and ends the episode. */
  st = rlserve_client_start_episode(client, NULL, 1, multi, sizeof multi);
  CHECK(st == RLSERVE_OK, "start multi-agent");
  st = rlserve_client_get_agent_actions(client, multi, 2, agents, two, sizes, actions, 8, action_sizes);
  CHECK(st == RLSERVE_OK && action_sizes[0] == 1 && action_sizes[1] == 1, "two agents act");
  CHECK(rlserve_client_log_agent_returns(client, multi, 2, agents, rewards, done) == RLSERVE_OK, "b terminated");
  st = rlserve_client_get_agent_actions(client, multi, 1, agents + 1, obs, sizes, actions, 8, action_sizes);
  CHECK(st == RLSERVE_EPISODE_ERROR, "a done agent may not act");
  done[1] = 7;
  st = rlserve_client_log_agent_returns(client, multi, 2, agents, rewards, done);
  CHECK(st == RLSERVE_INVALID_ARGUMENT && strstr(rlserve_last_error(), "done[1]") != NULL, "a bad done mark");
  st = rlserve_client_get_agent_actions(client, multi, 1, agents, obs, sizes, actions, 8, action_sizes);
  CHECK(st == RLSERVE_OK && action_sizes[0] == 1, "a acts on");
  CHECK(rlserve_client_end_agent_episode(client, multi, 1, agents, obs, sizes, 0) == RLSERVE_OK, "end multi-agent");
  steps += 3; /* a acted twice, b once (terminated: its step is complete) */
  st = rlserve_client_close(client);
  CHECK(st == RLSERVE_OK, "close");
  if (failures != 0) return 1;
  printf("steps: %d\n", steps);
  return 0;
}
