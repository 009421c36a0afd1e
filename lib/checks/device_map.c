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
#include "ipc/workspace.h"
#include "plane/device.h"

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

struct state {
	struct devrec me, *all;    /* [world] */
	int ordinal;
	int rc, arc, nrc;          /* device identity, allgather, NCCL probe */
	struct dptp_err err, aerr, nerr;
	bool shared;               /* two local ranks map to one device */
};

static int device_map_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	s->all = calloc((size_t)c->layout.world, sizeof(*s->all));
	return s->all ? 0 : dptp_err_set(err, -ENOMEM, "out of memory");
}

static void device_map_run(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	bool cuda = c->p.cuda;
	/* the device the workspace code path selects (and, on GPUs, makes
	 * current) -- from LOCAL_RANK, or from tp_rank under the fault */
	s->ordinal = dptp_workspace_device(&c->ipc);
	struct devrec *me = &s->me;
	*me = (struct devrec){
		.host = c->host_of[c->rank],
		.local_rank = c->peers[c->rank].local_rank,
		.ordinal = s->ordinal,
	};
	if (cuda) {
		s->rc = dptp_cuda_device_id(c->peers[c->rank].device, me->expect, sizeof(me->expect), &s->err);
		if (s->rc == 0)
			s->rc = dptp_cuda_use_device(s->ordinal, me->got, sizeof(me->got), &s->err);
		if (s->rc < 0)
			snprintf(me->got, sizeof(me->got), "ordinal %d: %s", s->ordinal, s->err.msg);
	} else {
		host_identity(c->peers[c->rank].device, me->expect, sizeof(me->expect));
		host_identity(s->ordinal, me->got, sizeof(me->got));
	}
	s->arc = dptp_xchg_allgather(&c->x, &c->world, me, sizeof(*me), s->all, &s->aerr);
	if (s->arc < 0)
		return;
	for (int r = 0; r < c->layout.world; r++)
		for (int q = 0; q < r; q++)
			s->shared |= s->all[q].host == s->all[r].host && strcmp(s->all[q].expect, s->all[r].expect) == 0;
	/* on GPUs, NCCL's own verdict on communicators over the devices now
	 * current -- the real symptom is "Duplicate GPU detected" */
	if (cuda && !s->shared)
		s->nrc = dptp_cuda_nccl_probe(&c->x, &c->world, &s->nerr);
	else if (cuda)
		dptp_xchg_barrier(&c->x, &c->world, NULL); /* the probe's round, for lockstep */
}

static void device_map_verify(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	const struct devrec *me = &s->me, *all = s->all;
	if (s->arc < 0) {
		dptp_result_fail(res, DPTP_ERROR, s->arc, &s->aerr, "device allgather");
		return;
	}
	if (s->rc < 0) {
		dptp_result_set(res, DPTP_FAIL, "global rank %d (local rank %d, tp rank %d) cannot use device %d: %s",
				c->rank, me->local_rank, c->me.tp, s->ordinal, s->err.msg);
	} else if (strcmp(me->got, me->expect) != 0) {
		/* whose device did it take? */
		int owner = -1;
		for (int r = 0; r < c->layout.world && owner < 0; r++)
			if (r != c->rank && all[r].host == me->host && strcmp(all[r].expect, me->got) == 0)
				owner = r;
		if (owner >= 0)
			dptp_result_set(res, DPTP_FAIL,
				"global rank %d (local rank %d, tp rank %d) is on %s, which belongs to global rank %d "
				"(local rank %d); its own is %s",
				c->rank, me->local_rank, c->me.tp, me->got, owner, all[owner].local_rank, me->expect);
		else
			dptp_result_set(res, DPTP_FAIL, "global rank %d (local rank %d) is on %s, expected %s",
					c->rank, me->local_rank, me->got, me->expect);
	}
	/* two local ranks whose LOCAL_RANK maps to one device: both fail */
	bool sharing_ok = getenv("DPTP_GPU_SHARING") && strcmp(getenv("DPTP_GPU_SHARING"), "1") == 0;
	for (int r = 0; r < c->layout.world && res->status == DPTP_PASS && !sharing_ok; r++)
		if (r != c->rank && all[r].host == me->host && strcmp(all[r].expect, me->expect) == 0)
			dptp_result_set(res, DPTP_FAIL,
				"local ranks %d and %d both map to %s (Duplicate GPU): check CUDA_VISIBLE_DEVICES",
				me->local_rank, all[r].local_rank, me->expect);
	if (c->p.cuda && !s->shared && s->nrc < 0 && s->nrc != -ENOTSUP) {
		bool others_wrong = false;
		for (int r = 0; r < c->layout.world; r++)
			others_wrong |= r != c->rank && strcmp(all[r].got, all[r].expect) != 0;
		if (res->status == DPTP_PASS && !others_wrong)
			dptp_result_set(res, DPTP_FAIL, "NCCL refused the devices in use: %s", s->nerr.msg);
		else if (res->status == DPTP_PASS)
			dptp_result_set(res, DPTP_PASS,
				"local rank %d on its own %s; NCCL refused the job because another rank took a "
				"device that is not its own: %s", me->local_rank, me->got, s->nerr.msg);
		else
			dptp_result_append(res, "; NCCL: %s", s->nerr.msg);
	}
	if (res->status == DPTP_PASS && (!res->detail || !*res->detail))
		dptp_result_set(res, DPTP_PASS, "local rank %d on %s%s", me->local_rank, me->got,
				s->shared && sharing_ok ? " (GPU shared, DPTP_GPU_SHARING=1)" : "");
}

static void device_map_release(struct dptp_ctx *c, void *state)
{
	free(((struct state *)state)->all);
}

const struct dptp_check dptp_check_device_map = {
	.name = "device-map",
	.summary = "each rank's device is the one for its LOCAL_RANK, and no two ranks share one",
	.mech = "D",
	.state_size = sizeof(struct state),
	.prepare = device_map_prepare,
	.run = device_map_run,
	.verify = device_map_verify,
	.release = device_map_release,
};
