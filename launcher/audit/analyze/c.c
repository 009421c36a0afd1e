/* dptp-run --audit, mechanism C: one port bound by ranks of different
 * replicas (a port offset by a coordinate they share: a DP rank forced to
 * 0). A collision the rank recovers from (the free-port loop) is none. */
#include "audit/analyze/model.h"

#include <stdio.h>

int find_c(struct st *s, const struct name_use *u, size_t n)
{
	int rc = 0;
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (!u[i].port || !u[i].reps || !name_collides(&u[i]))
			continue;
		char o[256], from[200];
		fmt_ranks(o, sizeof(o), u[i].owners, u[i].no);
		called_from(from, sizeof(from), u[i].site, u[i].outer);
		rc = add_finding(s, 'C', u[i].owners, u[i].no, u[i].site, "bind",
			"port %s taken by ranks %s of different replicas%s: %s; a port offset by a coordinate they share (a DP rank forced to 0)",
			u[i].key + 5, o, from, collision_how(&u[i]));
	}
	return rc;
}
