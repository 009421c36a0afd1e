#include "checks/ctx.h"

#include "dptp-config.h"
#include "ipc/workspace_gpu.h"
#include "plane/comm_nccl.h"
#include "plane/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t input_key(uint64_t seed, uint64_t stream)
{
	return dptp_mix64(dptp_mix64(seed ^ 0x5eedULL) ^ (stream * 0x9e3779b97f4a7c15ULL + 1));
}

/* Each 64-bit hash gives 16 values of 4 bits: -4 .. 3.5 in steps of 0.5,
 * exact in bf16, fp16 and fp32, and sums of a few dozen stay exact. */
static float value_of(uint64_t key, uint64_t index)
{
	uint64_t h = dptp_mix64(key + index / 16);
	return (float)((int)((h >> (4 * (index % 16))) & 15) - 8) * 0.5f;
}

float dptp_input_value(uint64_t seed, uint64_t stream, uint64_t index)
{
	return value_of(input_key(seed, stream), index);
}

DPTP_HOT void dptp_input_fill_at(void *p, size_t first, size_t n, uint64_t seed, uint64_t stream,
			enum dptp_dtype dt)
{
	uint64_t key = input_key(seed, stream);
	float tab[16];
	uint16_t tab16[16];
	for (int v = 0; v < 16; v++) {
		tab[v] = (float)(v - 8) * 0.5f;
		tab16[v] = dt == DPTP_DTYPE_BF16 ? dptp_f32_to_bf16(tab[v]) : dptp_f32_to_f16(tab[v]);
	}
	for (size_t e = first, end = first + n; e < end;) {
		uint64_t h = dptp_mix64(key + e / 16);
		size_t k = e % 16, m = end - e < 16 - k ? end - e : 16 - k;
		if (dt == DPTP_DTYPE_FP32)
			for (size_t i = 0; i < m; i++)
				((float *)p)[e - first + i] = tab[(h >> (4 * (k + i))) & 15];
		else
			for (size_t i = 0; i < m; i++)
				((uint16_t *)p)[e - first + i] = tab16[(h >> (4 * (k + i))) & 15];
		e += m;
	}
}

void dptp_input_fill(void *p, size_t n, uint64_t seed, uint64_t stream, enum dptp_dtype dt)
{
	dptp_input_fill_at(p, 0, n, seed, stream, dt);
}

/* The GPU data plane: NCCL with one GPU per rank, else the host data plane
 * staged through device memory. */
static int cuda_plane(struct dptp_ctx *c, struct dptp_err *err)
{
	int ord = -1;
	bool shared = false;
	DPTP_TRY(dptp_device_choose(&c->x, &c->world, c->peers, c->rank, &ord, &shared, err));
	c->ws = &dptp_ws_gpu_ops;
	struct dptp_comm *nc = NULL;
#if DPTP_HAVE_NCCL
	if (!shared) {
		const struct dptp_group *groups[] = { &c->tp, &c->pp, &c->dp, &c->ep };
		int rc = dptp_comm_nccl_create(&nc, &c->x, ord, groups, 4, err);
		if (rc < 0) {
			dptp_err_prefix(err, "NCCL data plane");
			return rc;
		}
		dptp_comm_destroy(c->comm);
		c->comm = nc;
		return 0;
	}
#endif
	DPTP_TRY(dptp_comm_staged_create(&nc, c->comm, &c->x, err));
	c->comm = nc;
	return 0;
}

int dptp_ctx_init(struct dptp_ctx *c, struct dptp_bootstrap *b, const struct dptp_params *p,
		  struct dptp_err *err)
{
	memset(c, 0, sizeof(*c));
	c->b = b;
	c->p = *p;
	c->rank = b->rank;
	DPTP_TRY(dptp_layout_init(&c->layout, b->size, p->dp, p->pp, p->tp, err));
	c->me = dptp_layout_coord(&c->layout, c->rank);
	dptp_exchange_init(&c->x, b, dptp_fault_on(p->faults, DPTP_FAULT_BCAST_GLOBAL_SRC));
	c->x.root_by_local_rank = dptp_fault_on(p->faults, DPTP_FAULT_ROOT_BY_LOCAL_RANK);
	c->x.deadline = dptp_now() + p->timeout;
	c->x.seq = p->xseq;

	int world = b->size;
	c->peers = calloc((size_t)world, sizeof(*c->peers));
	c->host_of = calloc((size_t)world, sizeof(int));
	if (!c->peers || !c->host_of)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	if (dptp_group_init(&c->tp, &c->layout, DPTP_GROUP_TP, c->rank) < 0 ||
	    dptp_group_init(&c->pp, &c->layout, DPTP_GROUP_PP, c->rank) < 0 ||
	    dptp_group_init(&c->dp, &c->layout, DPTP_GROUP_DP, c->rank) < 0 ||
	    dptp_group_init(&c->ep, &c->layout, DPTP_GROUP_EP, c->rank) < 0 ||
	    dptp_group_init(&c->world, &c->layout, DPTP_GROUP_WORLD, c->rank) < 0)
		return dptp_err_set(err, -ENOMEM, "out of memory");

	/* the device this rank uses: its LOCAL_RANK (an index into
	 * CUDA_VISIBLE_DEVICES when that is set) */
	struct dptp_peer me = {
		.local_rank = b->local_rank,
		.pid = (int32_t)getpid(),
		.device = b->local_rank,
	};
	snprintf(me.hostname, sizeof(me.hostname), "%s", b->hostname);
	if (dptp_entropy(&me.nonce, sizeof(me.nonce)) < 0)
		me.nonce = dptp_mix64((uint64_t)getpid() ^ (uint64_t)(dptp_now() * 1e9));
	int rc = dptp_xchg_allgather(&c->x, &c->world, &me, sizeof(me), c->peers, err);
	if (rc < 0) {
		dptp_err_prefix(err, "learning the peers");
		return rc;
	}
	c->ipc = (struct dptp_ipc_job){
		.x = &c->x, .rank = c->rank, .world = world, .peers = c->peers, .tp_rank = c->me.tp,
		.opid_seeded = dptp_fault_on(p->faults, DPTP_FAULT_OPID_SEEDED), .seed = p->seed,
		.device_from_tp_rank = dptp_fault_on(p->faults, DPTP_FAULT_DEVICE_TP_RANK),
		.foreign = &c->foreign,
	};
	for (int r = 0; r < world; r++) {
		c->peers[r].hostname[sizeof(me.hostname) - 1] = 0;
		int h = -1;
		for (int q = 0; q < r && h < 0; q++)
			if (strcmp(c->peers[q].hostname, c->peers[r].hostname) == 0)
				h = c->host_of[q];
		if (h < 0)
			h = c->nhosts++;
		c->host_of[r] = h;
		c->peers[r].host = h;
	}
	/* one value for the whole attempt, new on each: a restarted job's
	 * names never meet those of its killed predecessor */
	c->attempt = c->peers[0].nonce;

	/* the data plane moves at most every DP rank's tokens (dispatch) */
	size_t esz = dptp_dtype_bytes(p->dtype);
	size_t total_tokens = (size_t)c->layout.dp * (size_t)p->tokens +
			      (size_t)c->layout.dp * (size_t)(c->layout.dp - 1) / 2;
	size_t cap = total_tokens * (size_t)p->hidden * esz;
	if (cap < 65536)
		cap = 65536;
	c->ws = &dptp_ws_host_ops;
	rc = dptp_comm_host_create(&c->comm, &c->x, c->host_of, cap, c->attempt, err);
	if (rc < 0) {
		dptp_err_prefix(err, "host data plane");
		return rc;
	}
	if (p->cuda && (rc = cuda_plane(c, err)) < 0)
		dptp_err_prefix(err, "cuda backend");
	return rc;
}

void dptp_ctx_release(struct dptp_ctx *c)
{
	if (!c)
		return;
	dptp_comm_destroy(c->comm);
	c->comm = NULL;
	dptp_group_release(&c->tp);
	dptp_group_release(&c->pp);
	dptp_group_release(&c->dp);
	dptp_group_release(&c->ep);
	dptp_group_release(&c->world);
	free(c->peers);
	free(c->host_of);
	c->peers = NULL;
	c->host_of = NULL;
}
