/* device-map: each rank's device is the one for its LOCAL_RANK
 * (CUDA_VISIBLE_DEVICES-aware); a rank on another rank's device fails and
 * its detail names whose device it took. On the host backend the device is
 * simulated as the local rank's slot. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ctx.h"
#include "workspace.h"

struct devrec {
	int32_t host;
	int32_t local_rank;
	int32_t expect;   /* physical id for LOCAL_RANK */
	int32_t got;      /* physical id in use */
};

/* CUDA_VISIBLE_DEVICES maps an ordinal to a physical device; without it
 * the ordinal is the device. Entries that are not numbers (UUIDs, MIG ids)
 * are identified by their position. */
static int physical(int ordinal)
{
	const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
	if (!cvd || !*cvd || ordinal < 0)
		return ordinal;
	const char *p = cvd;
	for (int i = 0; i < ordinal && p; i++) {
		p = strchr(p, ',');
		if (p)
			p++;
	}
	if (!p)
		return 100000 + ordinal; /* beyond the list: not a visible device */
	char *end;
	long v = strtol(p, &end, 10);
	if (end == p || (*end && *end != ','))
		return 200000 + ordinal;
	return (int)v;
}

static void device_map_run(struct dptp_ctx *c, struct dptp_check_result *res)
{
	struct dptp_err err = {0};
	/* the device the workspace code path selects and makes current */
	int ordinal = dptp_workspace_device(c);
	struct devrec me = {
		.host = c->host_of[c->rank],
		.local_rank = c->peers[c->rank].local_rank,
		.expect = physical(c->peers[c->rank].local_rank),
		.got = physical(ordinal),
	};
	struct devrec *all = calloc((size_t)c->layout.world, sizeof(*all));
	if (!all) {
		dptp_result_set(res, DPTP_ERROR, "out of memory");
		return;
	}
	int rc = dptp_xchg_allgather(&c->x, &c->world, &me, sizeof(me), all, &err);
	if (rc < 0) {
		dptp_result_fail(res, DPTP_ERROR, rc, &err, "device allgather");
		free(all);
		return;
	}
	res->status = DPTP_PASS;
	if (me.got != me.expect) {
		/* whose device did it take? */
		int owner = -1;
		for (int r = 0; r < c->layout.world; r++)
			if (r != c->rank && all[r].host == me.host && all[r].expect == me.got) {
				owner = r;
				break;
			}
		if (owner >= 0)
			dptp_result_set(res, DPTP_FAIL,
				"global rank %d (local rank %d, tp rank %d) is on device %d, which belongs to global rank %d "
				"(local rank %d); its own is device %d",
				c->rank, me.local_rank, c->me.tp, me.got, owner, all[owner].local_rank, me.expect);
		else
			dptp_result_set(res, DPTP_FAIL,
				"global rank %d (local rank %d) is on device %d, expected device %d",
				c->rank, me.local_rank, me.got, me.expect);
	}
	/* two local ranks whose LOCAL_RANK maps to one device (a repeated
	 * CUDA_VISIBLE_DEVICES entry): both fail, NCCL would say "Duplicate GPU" */
	for (int r = 0; r < c->layout.world && res->status == DPTP_PASS; r++)
		if (r != c->rank && all[r].host == me.host && all[r].expect == me.expect)
			dptp_result_set(res, DPTP_FAIL,
				"local ranks %d and %d both map to device %d (Duplicate GPU): check CUDA_VISIBLE_DEVICES",
				me.local_rank, all[r].local_rank, me.expect);
	if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, "local rank %d on device %d", me.local_rank, me.got);
	free(all);
}

const struct dptp_check dptp_check_device_map = {
	.name = "device-map",
	.summary = "each rank's device is the one for its LOCAL_RANK, and no two ranks share one",
	.run = device_map_run,
};
