#include "checks/check.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
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

void dptp_result_set(struct dptp_check_result *r, enum dptp_status s, const char *fmt, ...)
{
	char buf[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	free(r->detail);
	r->detail = strdup(buf);
	r->status = s;
}

void dptp_result_fail(struct dptp_check_result *r, enum dptp_status as, int rc,
		      const struct dptp_err *err, const char *what)
{
	if (r->status >= DPTP_FAIL)
		return;
	enum dptp_status s = rc == -ETIMEDOUT ? DPTP_TIMEOUT : as;
	dptp_result_set(r, s, "%s: %s", what, err && err->msg[0] ? err->msg : strerror(-rc));
}
