/* dptp-run --audit, mechanism D: a device not LOCAL_RANK's (the culprits,
 * naming whose device they took); two ranks of one host on one device where
 * neither is at fault by that rule (LOCAL_RANK unknown). */
#include "audit/analyze/model.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool same_device(const struct st *s, int a, int b)
{
	return s->r[a].dev >= 0 && s->r[a].dev == s->r[b].dev && !strcmp(s->r[a].host, s->r[b].host);
}

int find_d(struct st *s)
{
	int rc = 0;
	int *bad = malloc(((size_t)s->size + 1) * sizeof(int));
	size_t nbad = 0, off = 0;
	char detail[1024] = "", site[160] = "";
	if (!bad)
		return -ENOMEM;
	for (int a = 0; a < s->size; a++) {
		int da = s->r[a].dev;
		if (da < 0 || s->r[a].local_rank < 0 || da == s->r[a].local_rank)
			continue;
		char owner[96] = "";
		for (int b = 0; b < s->size; b++)
			if (b != a && same_device(s, a, b)) {
				snprintf(owner, sizeof(owner), ", the device of rank %d too (NCCL: \"Duplicate GPU detected\")", b);
				break;
			}
		if (!nbad)
			snprintf(site, sizeof(site), "%s", s->r[a].dev_site);
		bad[nbad++] = a;
		if (off < sizeof(detail))
			off += (size_t)snprintf(detail + off, sizeof(detail) - off, "%srank %d (LOCAL_RANK %d) selected cuda:%d%s",
				off ? "; " : "", a, s->r[a].local_rank, da, owner);
	}
	if (nbad)
		rc = add_finding(s, 'D', bad, nbad, site, "set_device",
			"%s: a device index taken from another coordinate than LOCAL_RANK (the TP rank, a masked index)", detail);
	for (int a = 0; a < s->size && rc == 0; a++) {
		if (s->r[a].dev < 0 || s->r[a].local_rank >= 0)
			continue;
		int two[2] = {a, -1};
		bool first = true;
		for (int b = 0; b < s->size; b++)
			if (b != a && same_device(s, a, b)) {
				first &= b > a;
				if (two[1] < 0 && b > a)
					two[1] = b;
			}
		if (two[1] >= 0 && first)
			rc = add_finding(s, 'D', two, 2, s->r[a].dev_site, "set_device",
				"ranks %d and %d of host %s both use cuda:%d (NCCL: \"Duplicate GPU detected\")", two[0], two[1],
				s->r[a].host, s->r[a].dev);
	}
	free(bad);
	return rc;
}
