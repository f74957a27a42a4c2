/* The C ABI from C: a policy from the server's CartPole `weights` body, actions, and errors;
 * the network client's argument and connection errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rlserve.h"

static int failures = 0;
#define CHECK(cond, what)                                                   \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, (what));   \
      ++failures;                                                           \
    }                                                                       \
  } while (0)

static uint8_t* read_file(const char* path, size_t* size) {
  FILE* f = fopen(path, "rb");
  uint8_t* data;
  long n;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  data = (uint8_t*)malloc((size_t)n);
  if (data != NULL && fread(data, 1, (size_t)n, f) != (size_t)n) {
    free(data);
    data = NULL;
  }
  fclose(f);
  *size = (size_t)n;
  return data;
}

int main(int argc, char** argv) {
  char path[4096];
  size_t size = 0, beta_size = 0, i;
  uint8_t *body, *beta;
  rlserve_policy *policy = NULL, *twin = NULL, *none = NULL;
  rlserve_status st;
  float obs[3 * 4] = {0.015625f, -0.25f, 0.03125f, 0.5f, -0.015625f, 0.25f, -0.03125f, -0.5f, 0, 0, 0, 0};
  double actions[3], rows[3], logps[3], again[3];
  const uint8_t garbage[] = {0x91, 0x01};

  if (argc < 2) {
    fprintf(stderr, "usage: test_c_api <folder with weights.bin and weights_beta.bin>\n");
    return 2;
  }
  snprintf(path, sizeof path, "%s/weights.bin", argv[1]);
  body = read_file(path, &size);
  snprintf(path, sizeof path, "%s/weights_beta.bin", argv[1]);
  beta = read_file(path, &beta_size);
  if (body == NULL || beta == NULL) {
    fprintf(stderr, "cannot read the fixtures in %s\n", argv[1]);
    return 2;
  }
  CHECK(rlserve_protocol_version() == 1, "protocol version 1");

  st = rlserve_policy_create(body, size, 42, &policy);
  CHECK(st == RLSERVE_OK && policy != NULL, rlserve_last_error());
  if (policy == NULL) return 1;
  CHECK(rlserve_policy_obs_dim(policy) == 4, "obs_dim 4");
  CHECK(rlserve_policy_action_columns(policy) == 1, "one action column");
  CHECK(rlserve_policy_state_size(policy) == 0, "no memory");
  CHECK(rlserve_policy_version(policy) == 0, "weights version 0");

  /* Greedy: deterministic, Discrete(2) values; the rows are the choice indices. */
  st = rlserve_policy_compute_actions(policy, 3, obs, NULL, 0, actions, rows, logps);
  CHECK(st == RLSERVE_OK, rlserve_last_error());
  CHECK(strcmp(rlserve_last_error(), "") == 0, "no message after a success");
  for (i = 0; i < 3; ++i) {
    CHECK(actions[i] == 0.0 || actions[i] == 1.0, "a CartPole action is 0 or 1");
    CHECK(rows[i] == actions[i], "action_start 0: the row is the action");
    CHECK(logps[i] < 0.0 && logps[i] > -20.0, "a finite negative log-probability");
  }
  st = rlserve_policy_compute_actions(policy, 3, obs, NULL, 0, again, NULL, NULL);
  CHECK(st == RLSERVE_OK && memcmp(actions, again, sizeof actions) == 0, "greedy actions repeat");

  /* Sampling: two policies with the same seed draw the same actions. */
  st = rlserve_policy_create(body, size, 42, &twin);
  CHECK(st == RLSERVE_OK, rlserve_last_error());
  for (i = 0; i < 50 && twin != NULL; ++i) {
    rlserve_policy_compute_actions(policy, 3, obs, NULL, 1, actions, NULL, logps);
    rlserve_policy_compute_actions(twin, 3, obs, NULL, 1, again, NULL, NULL);
    CHECK(memcmp(actions, again, sizeof actions) == 0, "the same seed, the same samples");
  }

  /* Errors: a code and a message, nothing written. */
  st = rlserve_policy_create(garbage, sizeof garbage, 1, &none);
  CHECK(st == RLSERVE_DECODE_ERROR && none == NULL, "a body that is not a map");
  CHECK(strlen(rlserve_last_error()) > 0, "a decode error has a message");
  CHECK(strcmp(rlserve_status_name(st), "decode_error") == 0, "status name");
  st = rlserve_policy_create(beta, beta_size, 1, &none);
  CHECK(st == RLSERVE_UNSUPPORTED_MODEL && none == NULL, "an unknown distribution is refused");
  CHECK(strstr(rlserve_last_error(), "'beta'") != NULL, "the message names the kind");
  printf("unsupported model: %s\n", rlserve_last_error());
  st = rlserve_policy_create(body, size - 1, 1, &none);
  CHECK(st == RLSERVE_DECODE_ERROR, "a truncated body");
  st = rlserve_policy_create(body, size, 1, NULL);
  CHECK(st == RLSERVE_INVALID_ARGUMENT, "out == NULL");
  obs[9] = NAN;
  actions[0] = -7.0;
  st = rlserve_policy_compute_actions(policy, 3, obs, NULL, 1, actions, NULL, NULL);
  CHECK(st == RLSERVE_BAD_VALUE && actions[0] == -7.0, "a NaN observation: bad_value, nothing written");
  CHECK(strstr(rlserve_last_error(), "observation 2") != NULL, "the message names the observation");
  st = rlserve_policy_compute_actions(NULL, 1, obs, NULL, 1, actions, NULL, NULL);
  CHECK(st == RLSERVE_INVALID_ARGUMENT, "policy == NULL");

  /* The network client's arguments (no server needed): a code and a message, no handle. */
  {
    rlserve_client* client = (rlserve_client*)&failures; /* overwritten with NULL on failure */
    rlserve_client_options options;
    memset(&options, 0, sizeof options);
    options.connect_timeout = 2.0;
    st = rlserve_client_connect(NULL, NULL, NULL, NULL, &client);
    CHECK(st == RLSERVE_INVALID_ARGUMENT && client == NULL, "address NULL");
    st = rlserve_client_connect("no-port", NULL, NULL, NULL, &client);
    CHECK(st == RLSERVE_INVALID_ARGUMENT && strstr(rlserve_last_error(), "host:port") != NULL, "an address without a port");
    st = rlserve_client_connect("127.0.0.1:1", NULL, "hosted", NULL, &client);
    CHECK(st == RLSERVE_INVALID_ARGUMENT && strstr(rlserve_last_error(), "\"local\"") != NULL, "an unknown mode names both");
    st = rlserve_client_connect("127.0.0.1:1", NULL, "local", &options, &client);
    CHECK(st == RLSERVE_CONNECTION_LOST && client == NULL, "local mode: nothing listens on port 1");
    st = rlserve_client_connect("127.0.0.1:1", NULL, "remote", &options, &client);
    CHECK(st == RLSERVE_CONNECTION_LOST && client == NULL, "nothing listens on port 1");
    CHECK(strstr(rlserve_last_error(), "127.0.0.1:1") != NULL, "the message names the address");
    CHECK(strcmp(rlserve_status_name(st), "connection_lost") == 0, "connection_lost's name");
    CHECK(strcmp(rlserve_status_name(RLSERVE_EPISODE_LOST), "episode_lost") == 0, "episode_lost's name");
    CHECK(rlserve_client_close(NULL) == RLSERVE_OK, "close(NULL)");
    CHECK(rlserve_client_get_action(NULL, "e", obs, 4, actions, 1, NULL) == RLSERVE_INVALID_ARGUMENT, "client NULL");
    {
      const char* ids[1] = {"e"};
      size_t sizes[1] = {4}, n = 0;
      int done[1] = {RLSERVE_AGENT_TERMINATED};
      CHECK(rlserve_client_sizes(NULL, &n, &n) == RLSERVE_INVALID_ARGUMENT, "sizes: client NULL");
      CHECK(rlserve_client_log_action(NULL, "e", obs, 4, actions, 1) == RLSERVE_INVALID_ARGUMENT, "log_action: client NULL");
      CHECK(rlserve_client_log_returns_info(NULL, "e", 1.0, ids, actions, 1) == RLSERVE_INVALID_ARGUMENT, "info: client NULL");
      CHECK(rlserve_client_get_actions(NULL, 1, ids, obs, 4, actions, 3, &n) == RLSERVE_INVALID_ARGUMENT, "batch: client NULL");
      CHECK(rlserve_client_get_agent_actions(NULL, "e", 1, ids, obs, sizes, actions, 3, sizes) == RLSERVE_INVALID_ARGUMENT,
            "agents: client NULL");
      CHECK(rlserve_client_log_agent_returns(NULL, "e", 1, ids, actions, done) == RLSERVE_INVALID_ARGUMENT,
            "agent returns: client NULL");
      CHECK(rlserve_client_end_agent_episode(NULL, "e", 1, ids, obs, sizes, 0) == RLSERVE_INVALID_ARGUMENT,
            "agent end: client NULL");
      CHECK(strstr(rlserve_last_error(), "NULL") != NULL, "the message says what is NULL");
    }
  }

  rlserve_policy_destroy(policy);
  rlserve_policy_destroy(twin);
  rlserve_policy_destroy(NULL);
  free(body);
  free(beta);
  if (failures == 0) printf("test_c_api: all checks passed\n");
  return failures == 0 ? 0 : 1;
}
