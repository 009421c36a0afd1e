#include "check.h"

#include <string.h>

/* Kept in enum order; lib/checks/registry.c asserts it matches. */
static const char *const names[DPTP_NCHECKS] = {
	[DPTP_CHECK_BROADCAST] = "broadcast",
	[DPTP_CHECK_OPID] = "opid",
	[DPTP_CHECK_DEVICE_MAP] = "device-map",
	[DPTP_CHECK_FUSED_ALLREDUCE] = "fused-allreduce",
	[DPTP_CHECK_DISPATCH] = "dispatch",
};

int dptp_check_lookup(const char *name)
{
	for (int i = 0; i < DPTP_NCHECKS; i++)
		if (strcmp(names[i], name) == 0)
			return i;
	return -1;
}

const char *dptp_check_name(int id)
{
	return id >= 0 && id < DPTP_NCHECKS ? names[id] : NULL;
}
