/* rlserve's C ABI: opaque handles, plain arrays, status codes with a message. No C++ exception
 * crosses it. So far it covers local inference from a `weights` reply (docs/protocol.md
 * section 14); the network client comes next. */
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
  RLSERVE_INTERNAL = 7           /* a bug in this library */
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

#ifdef __cplusplus
}
#endif

#endif /* RLSERVE_H */
