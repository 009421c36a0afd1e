/* The registry: the one list of checks, in report order. A check's name is
 * its struct's .name; adding a check is one entry in CHECKS (and its file in
 * meson.build). */
#include "checks/check.h"

#define CHECKS(X) \
	X(broadcast) \
	X(opid) \
	X(device_map) \
	X(fused_allreduce) \
	X(dispatch) \
	X(resources) \
	X(reduce_span) \
	X(lockstep)

#define DECLARE(n) extern const struct dptp_check dptp_check_##n;
#define ROW(n) &dptp_check_##n,
CHECKS(DECLARE)

const struct dptp_check *const dptp_checks[] = { CHECKS(ROW) };

const int dptp_nchecks = (int)DPTP_ARRAY_LEN(dptp_checks);

_Static_assert(DPTP_ARRAY_LEN(dptp_checks) <= DPTP_MAX_CHECKS, "--checks is a 32-bit mask");
