/* Links the installed static library from C. */
#include <stdio.h>

#include "rlserve.h"

int main(void) {
  const uint8_t not_a_map[] = {0x01};
  rlserve_policy* policy = NULL;
  rlserve_status st = rlserve_policy_create(not_a_map, sizeof not_a_map, 0, &policy);
  if (rlserve_protocol_version() != 1 || st != RLSERVE_DECODE_ERROR || policy != NULL) return 1;
  printf("consumer_c: protocol %d, %s: %s\n", rlserve_protocol_version(), rlserve_status_name(st),
         rlserve_last_error());
  return 0;
}
