/* device-map: each rank's device is the one for its LOCAL_RANK
 * (CUDA_VISIBLE_DEVICES-aware); a rank on another rank's device fails and
 * its detail names whose device it took. On the host backend the device is
 * simulated as the local rank's slot; on GPUs it is the real current device
 * (UUID and PCI bus id), and NCCL is asked for its own verdict. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "checks/ctx.h"
#include "checks/cuda_backend.h"
#include "ipc/workspace.h"

struct devrec {
	int32_t host;
	int32_t local_rank;
	int32_t ordinal;
	int32_t pad;
	char expect[96];   /* identity of the device for LOCAL_RANK */
	char got[96];      /* identity of the device in use */
};

/* Host backend: CUDA_VISIBLE_DEVICES maps an ordinal to a physical device;
 * without it the ordinal is the device. */
static void host_identity(int ordinal, char *buf, size_t n)
{
	const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
	if (!cvd || !*cvd) {
		snprintf(buf, n, "device %d", ordinal);
		return;
	}
	const char *p = cvd;
	for (int i = 0; i < ordinal && p; i++) {
		p = strchr(p, ',');
		if (p)
			p++;
	}
	if (!p) {
		snprintf(buf, n, "ordinal %d beyond CUDA_VISIBLE_DEVICES=%s", ordinal, cvd);
		return;
	}
	size_t len = strcspn(p, ",");
	snprintf(buf, n, "device %.*s", (int)(len < 64 ? len : 64), p);
}

static void device_map_run(struct dptp_ctx *c, struct dptp_check_result *res)
{
	struct dptp_err err = {0};
	bool cuda = c->p.cuda;
	/* the device the workspace code path selects (and, on GPUs, makes
	 * current) -- from LOCAL_RANK, or from tp_rank under the fault */
	int ordinal = dptp_workspace_device(c);
	struct devrec me = {
		.host = c->host_of[c->rank],
		.local_rank = c->peers[c->rank].local_rank,
		.ordinal = ordinal,
	};
	int rc = 0;
	if (cuda) {
		rc = dptp_cuda_device_id(c->peers[c->rank].device, me.expect, sizeof(me.expect), &err);
		if (rc == 0)
			rc = dptp_cuda_use_device(ordinal, me.got, sizeof(me.got), &err);
		if (rc < 0)
			snprintf(me.got, sizeof(me.got), "ordinal %d: %s", ordinal, err.msg);
	} else {
		host_identity(c->peers[c->rank].device, me.expect, sizeof(me.expect));
		host_identity(ordinal, me.got, sizeof(me.got));
	}
	struct devrec *all = calloc((size_t)c->layout.world, sizeof(*all));
	if (!all) {
		dptp_result_set(res, DPTP_ERROR, "out of memory");
		dptp_xchg_barrier(&c->x, &c->world, NULL);
		return;
	}
	int arc = dptp_xchg_allgather(&c->x, &c->world, &me, sizeof(me), all, &err);
	if (arc < 0) {
		dptp_result_fail(res, DPTP_ERROR, arc, &err, "device allgather");
		free(all);
		return;
	}
	res->status = DPTP_PASS;
	if (rc < 0) {
		dptp_result_set(res, DPTP_FAIL, "global rank %d (local rank %d, tp rank %d) cannot use device %d: %s",
				c->rank, me.local_rank, c->me.tp, ordinal, err.msg);
	} else if (strcmp(me.got, me.expect) != 0) {
		/* whose device did it take? */
		int owner = -1;
		for (int r = 0; r < c->layout.world && owner < 0; r++)
			if (r != c->rank && all[r].host == me.host && strcmp(all[r].expect, me.got) == 0)
				owner = r;
		if (owner >= 0)
			dptp_result_set(res, DPTP_FAIL,
				"global rank %d (local rank %d, tp rank %d) is on %s, which belongs to global rank %d "
				"(local rank %d); its own is %s",
				c->rank, me.local_rank, c->me.tp, me.got, owner, all[owner].local_rank, me.expect);
		else
			dptp_result_set(res, DPTP_FAIL, "global rank %d (local rank %d) is on %s, expected %s",
					c->rank, me.local_rank, me.got, me.expect);
	}
	/* two local ranks whose LOCAL_RANK maps to one device: both fail */
	bool sharing_ok = getenv("DPTP_GPU_SHARING") && strcmp(getenv("DPTP_GPU_SHARING"), "1") == 0;
	bool shared = false;
	for (int r = 0; r < c->layout.world; r++)
		for (int q = 0; q < r; q++)
			shared |= all[q].host == all[r].host && strcmp(all[q].expect, all[r].expect) == 0;
	for (int r = 0; r < c->layout.world && res->status == DPTP_PASS && !sharing_ok; r++)
		if (r != c->rank && all[r].host == me.host && strcmp(all[r].expect, me.expect) == 0)
			dptp_result_set(res, DPTP_FAIL,
				"local ranks %d and %d both map to %s (Duplicate GPU): check CUDA_VISIBLE_DEVICES",
				me.local_rank, all[r].local_rank, me.expect);
	/* on GPUs, NCCL's own verdict on communicators over the devices now
	 * current -- the real symptom is "Duplicate GPU detected" */
	if (cuda && !shared) {
		struct dptp_err ne = {0};
		int nrc = dptp_cuda_nccl_probe(c, &c->world, &ne);
		if (nrc < 0 && nrc != -ENOTSUP) {
			char extra[DPTP_ERR_MAX + 64];
			snprintf(extra, sizeof(extra), "; NCCL: %s", ne.msg);
			bool others_wrong = false;
			for (int r = 0; r < c->layout.world; r++)
				others_wrong |= r != c->rank && strcmp(all[r].got, all[r].expect) != 0;
			if (res->status == DPTP_PASS && !others_wrong)
				dptp_result_set(res, DPTP_FAIL, "NCCL refused the devices in use: %s", ne.msg);
			else if (res->status == DPTP_PASS)
				dptp_result_set(res, DPTP_PASS,
					"local rank %d on its own %s; NCCL refused the job because another rank took a "
					"device that is not its own: %s", me.local_rank, me.got, ne.msg);
			else {
				char *d = malloc(strlen(res->detail) + strlen(extra) + 1);
				if (d) {
					strcpy(d, res->detail);
					strcat(d, extra);
					free(res->detail);
					res->detail = d;
				}
			}
		}
	} else if (cuda) {
		dptp_xchg_barrier(&c->x, &c->world, NULL); /* the probe's round, for lockstep */
	}
	if (res->status == DPTP_PASS && (!res->detail || !*res->detail))
		dptp_result_set(res, DPTP_PASS, "local rank %d on %s%s", me.local_rank, me.got,
				shared && sharing_ok ? " (GPU shared, DPTP_GPU_SHARING=1)" : "");
	free(all);
}

const struct dptp_check dptp_check_device_map = {
	.name = "device-map",
	.summary = "each rank's device is the one for its LOCAL_RANK, and no two ranks share one",
	.run = device_map_run,
};
