/* rlserve's C ABI: opaque handles, plain arrays, status codes with a message. No C++ exception
 * crosses it. It covers the network client with remote inference (rlserve_client_*) and local
 * inference from a `weights` reply (rlserve_policy_*, docs/protocol.md section 14). */
#ifndef RLSERVE_H
#define RLSERVE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. The first are the protocol's error codes (section 8) where the wire defines the
 * failure. */
typedef enum rlserve_status {
  RLSERVE_OK = 0,
  RLSERVE_DECODE_ERROR = 1,      /* bytes that are not a valid message */
  RLSERVE_LIMIT_EXCEEDED = 2,    /* a container, array or id over a limit */
  RLSERVE_FRAME_TOO_LARGE = 3,   /* a frame over max_frame_bytes */
  RLSERVE_BAD_VALUE = 4,         /* a value that does not fit (e.g. no legal action) */
  RLSERVE_UNSUPPORTED_MODEL = 5, /* a model kind this library does not implement */
  RLSERVE_INVALID_ARGUMENT = 6,  /* a null pointer, a wrong size */
  RLSERVE_INTERNAL = 7,          /* a bug in this library */
  /* The network client's (the server's error codes of section 8 among them). */
  RLSERVE_CONNECTION_LOST = 8,   /* unreachable, or not again within the reconnect timeout */
  RLSERVE_TIMEOUT = 9,           /* no reply in time */
  RLSERVE_UNAUTHORIZED = 10,     /* a wrong or missing token */
  RLSERVE_VERSION_MISMATCH = 11, /* another protocol version or inference mode */
  RLSERVE_EPISODE_ERROR = 12,    /* unknown, ended or another client's episode; out of order */
  RLSERVE_EPISODE_LOST = 13,     /* the server restarted since the episode started: start anew */
  RLSERVE_CAPACITY = 14,         /* too many open episodes or connections */
  RLSERVE_UNSUPPORTED_SPACE = 15,
  RLSERVE_FORBIDDEN = 16,
  RLSERVE_SERVER_INTERNAL = 17,  /* the server failed because of its own fault */
  RLSERVE_TLS_ERROR = 18         /* a TLS handshake or certificate failure */
} rlserve_status;

/* The message of the last failed call on this thread (empty after a success); valid until the
 * thread's next call into the library. */
const char* rlserve_last_error(void);
/* The name of a status ("decode_error", ...). */
const char* rlserve_status_name(rlserve_status status);
/* The protocol version this library speaks (1). */
int rlserve_protocol_version(void);

/* A local-inference policy: one weights version's network and action rule. A handle may be used
 * from several threads; calls on it are serialised. */
typedef struct rlserve_policy rlserve_policy;

/* Builds a policy from the msgpack body of a `weights` reply (section 7.9: the frame without
 * its 4-byte length prefix), drawing its random numbers from a generator seeded with `seed`. */
rlserve_status rlserve_policy_create(const uint8_t* weights_body, size_t size, uint64_t seed,
                                     rlserve_policy** out);
/* Frees a policy (NULL is allowed). */
void rlserve_policy_destroy(rlserve_policy* policy);

/* Sizes: the flattened observation's length, the action row's width (one column per Discrete
 * choice, Box element, bit; section 6.3), the recurrent state's floats per episode (0 without
 * memory), the network's output width. */
size_t rlserve_policy_obs_dim(const rlserve_policy* policy);
size_t rlserve_policy_action_columns(const rlserve_policy* policy);
size_t rlserve_policy_state_size(const rlserve_policy* policy);
/* The weights version the policy was built from. */
uint64_t rlserve_policy_version(const rlserve_policy* policy);

/* Computes actions for `count` flattened observations (`observations`: count * obs_dim floats,
 * row after row). explore != 0 samples from the distribution; 0 takes the greedy action.
 * `states`: count * state_size floats, each episode's recurrent state (zeros at its start), read
 * and replaced by the state after the step; NULL when state_size is 0.
 * Outputs, each count * action_columns (logps: count) values, row after row:
 *   actions: the values to send to the simulator (a Discrete value, a clipped Box value, ...);
 *   rows:    the flat action rows to report (choice indices, unclipped values), or NULL;
 *   logps:   each action's log-probability, or NULL.
 * On failure nothing is written (states included) and the message names the observation. */
rlserve_status rlserve_policy_compute_actions(rlserve_policy* policy, size_t count,
                                              const float* observations, float* states,
                                              int explore, double* actions, double* rows,
                                              double* logps);

/* A network client with remote inference: the server computes each action. Thread-safe (calls
 * on one handle are serialised). Episode calls carry sequence numbers and are re-sent over a new
 * connection when one breaks (applied once); after a server restart the episodes that were open
 * fail with RLSERVE_EPISODE_LOST: start a new episode and carry on. With inference_mode "local"
 * the same calls act in this process (rlserve::LocalClient with its default LocalOptions) and
 * ship the experience in the background; rlserve_client_close ships what is left. */
typedef struct rlserve_client rlserve_client;

/* Optional settings of rlserve_client_connect; zero/NULL fields take the defaults. */
typedef struct rlserve_client_options {
  const char* client_name;   /* shown in the server's logs ("cpp-client") */
  const char* client_id;     /* the client identity; NULL: a random one, kept across reconnections */
  const char* tls_ca;        /* CA file (PEM) for a tls:// address; NULL: the system's trust store */
  double connect_timeout;    /* seconds (10) */
  double request_timeout;    /* seconds for a reply (60) */
  double reconnect_timeout;  /* seconds a call keeps reconnecting after a break (30) */
  int no_observation_check;  /* nonzero: do not check observations before sending */
} rlserve_client_options;

/* Connects to `address` ("host:port" or "tls://host:port"; or several front-ends of one run,
 * comma-separated: the first that answers is used, and the client moves to another when it
 * dies) and says hello with `token` (NULL: none) and `inference_mode` (NULL or "remote", or
 * "local").
 * `options` may be NULL. A refused hello is RLSERVE_UNAUTHORIZED (or ...) with the server's
 * message. */
rlserve_status rlserve_client_connect(const char* address, const char* token, const char* inference_mode,
                                      const rlserve_client_options* options, rlserve_client** out);
/* Starts an episode (`episode_id` NULL: a random id) and writes its id, NUL-terminated, to
 * `id_out` (`id_capacity` bytes; 129 always suffice). */
rlserve_status rlserve_client_start_episode(rlserve_client* client, const char* episode_id, int training_enabled,
                                            char* id_out, size_t id_capacity);
/* The action for an observation of a Box (or Discrete) observation space given as `size`
 * floats, row-major; the reward logged since the last call travels with it. The action's
 * numbers go to `action` (at most `action_capacity`; their count to `action_size`): a
 * Discrete action is one number, a Box action its elements row-major (see ServerAction::values). */
rlserve_status rlserve_client_get_action(rlserve_client* client, const char* episode_id, const float* observation,
                                         size_t size, double* action, size_t action_capacity, size_t* action_size);
/* Adds `reward` to the episode's previous action (sent with its next call). */
rlserve_status rlserve_client_log_returns(rlserve_client* client, const char* episode_id, double reward);
/* Ends the episode with its final observation (`truncated` nonzero: cut short, e.g. a time
 * limit). Pipelined: a refusal is returned by the next call. */
rlserve_status rlserve_client_end_episode(rlserve_client* client, const char* episode_id, const float* observation,
                                          size_t size, int truncated);
/* How many numbers an observation and an action of the served policy take as plain arrays
 * (either pointer may be NULL). The order is the one every call uses: a Discrete is one number
 * (its value), a Box's, MultiDiscrete's or MultiBinary's elements row-major, a Dict's members in
 * key order, a Tuple's in order. */
rlserve_status rlserve_client_sizes(const rlserve_client* client, size_t* observation_size, size_t* action_size);
/* Records an action the policy did not choose (a human player, a script) for `observation`:
 * `action` holds its `action_size` numbers in get_action's form (a Discrete's value, ...). The
 * reward logged since the last call travels with it. */
rlserve_status rlserve_client_log_action(rlserve_client* client, const char* episode_id, const float* observation,
                                         size_t size, const double* action, size_t action_size);
/* rlserve_client_log_returns with an `info` map of `count` entries, keys[i] -> values[i] (kept
 * with the step, merged with an info logged before it; not trained on). */
rlserve_status rlserve_client_log_returns_info(rlserve_client* client, const char* episode_id, double reward,
                                               const char* const* keys, const double* values, size_t count);

/* Batched calls for a vectorised engine: `count` episodes in one round trip. `observations`
 * holds count * size floats, one episode's after another; `actions` receives count rows of
 * `*action_size` numbers each (capacity: `action_capacity` numbers). With "local" inference the
 * actions are computed here, one episode after another. */
rlserve_status rlserve_client_get_actions(rlserve_client* client, size_t count, const char* const* episode_ids,
                                          const float* observations, size_t size, double* actions,
                                          size_t action_capacity, size_t* action_size);

/* Multi-agent episodes (docs/protocol.md section 15; with "local" inference every agent must act
 * for the client's policy, `default`). Agent i's observation is
 * observation_sizes[i] floats of `observations`, packed one after another, read with the
 * observation space of the agent's policy (the welcome's mapping). */
rlserve_status rlserve_client_get_agent_actions(rlserve_client* client, const char* episode_id, size_t count,
                                                const char* const* agent_ids, const float* observations,
                                                const size_t* observation_sizes, double* actions,
                                                size_t action_capacity, size_t* action_sizes);
/* The actions of rlserve_client_get_agent_actions are packed in the same way: agent i's are
 * action_sizes[i] numbers (action_sizes holds `count` entries). */

/* An agent's done mark. */
enum {
  RLSERVE_AGENT_ACTING = 0,     /* acts on */
  RLSERVE_AGENT_TERMINATED = 1, /* reached a terminal state: acts no more */
  RLSERVE_AGENT_TRUNCATED = 2   /* cut short (e.g. its time limit): acts no more */
};
/* Rewards for `count` agents' previous actions, sent at once; `done` (NULL: none done) holds an
 * RLSERVE_AGENT_* mark per agent. */
rlserve_status rlserve_client_log_agent_returns(rlserve_client* client, const char* episode_id, size_t count,
                                                const char* const* agent_ids, const double* rewards, const int* done);
/* Ends a multi-agent episode with the final observations of `count` agents (0 allowed), packed
 * as in get_agent_actions. Pipelined like rlserve_client_end_episode. */
rlserve_status rlserve_client_end_agent_episode(rlserve_client* client, const char* episode_id, size_t count,
                                                const char* const* agent_ids, const float* observations,
                                                const size_t* observation_sizes, int truncated);

/* Successful reconnections so far. */
int rlserve_client_reconnects(const rlserve_client* client);
/* Reads the pipelined replies, disconnects and frees the client (NULL is allowed); the status of
 * a deferred error, the client is freed either way. */
rlserve_status rlserve_client_close(rlserve_client* client);

#ifdef __cplusplus
}
#endif

#endif /* RLSERVE_H */
