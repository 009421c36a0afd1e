/* broadcast: the exchange backend's broadcast, from every group-local root
 * of every group of two or more ranks inside one DP replica (TP groups, PP
 * groups when pp > 1), delivers that root's payload on the control plane
 * (objects) and on the data plane (buffers). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checks/check.h"
#include "checks/ctx.h"

struct stamp {
	int32_t global_rank;
	int32_t kind;
	int32_t root;
	int32_t pad;
	uint64_t nonce;
};

static uint64_t nonce_of(const struct dptp_ctx *c, int kind, int root, int global)
{
	return dptp_mix64(c->p.seed ^ ((uint64_t)kind << 48) ^ ((uint64_t)root << 32) ^ (uint64_t)global);
}

#define DATA_WORDS 256

static void run_group(struct dptp_ctx *c, const struct dptp_group *g, int maxsize,
		      struct dptp_check_result *res, int *nbcast)
{
	struct dptp_err err = {0};
	char gs[256];
	dptp_group_format(g, gs, sizeof(gs));
	uint32_t *data = c->comm->ops->alloc(c->comm, DATA_WORDS * sizeof(uint32_t));
	uint32_t host[DATA_WORDS];
	/* the same number of rounds on every rank: groups of one kind have
	 * one size, so `maxsize` is everyone's loop bound */
	for (int root = 0; root < maxsize; root++) {
		int want = g->ranks[root < g->size ? root : 0];
		/* control plane: an object stamped with the root's identity */
		struct stamp s = {0};
		if (c->rank == want) {
			s.global_rank = c->rank;
			s.kind = g->kind;
			s.root = root;
			s.nonce = nonce_of(c, g->kind, root, c->rank);
		}
		int rc = dptp_xchg_bcast_root(&c->x, g, root, &s, sizeof(s), c->p.faults, &err);
		(*nbcast)++;
		if (rc < 0) {
			char what[300];
			snprintf(what, sizeof(what), "object broadcast in %s group %s from group rank %d",
				 dptp_group_kind_name(g->kind), gs, root);
			dptp_result_fail(res, DPTP_FAIL, rc, &err, what);
		} else if (s.global_rank != want || s.root != root ||
			   s.nonce != nonce_of(c, g->kind, root, want)) {
			if (res->status < DPTP_FAIL)
				dptp_result_set(res, DPTP_FAIL,
					"object broadcast in %s group %s from group rank %d (global rank %d) "
					"delivered the payload of global rank %d",
					dptp_group_kind_name(g->kind), gs, root, want, s.global_rank);
		}
		/* data plane: a buffer whose every word names the root */
		for (int i = 0; i < DATA_WORDS; i++)
			host[i] = c->rank == want ? (uint32_t)dptp_mix64(nonce_of(c, g->kind, root, want) + (uint64_t)i)
						  : 0xdeadbeefu;
		c->comm->ops->upload(c->comm, data, host, sizeof(host));
		rc = dptp_xchg_bcast_buf(&c->x, c->comm, g, root, data, sizeof(host), c->p.faults, &err);
		if (rc < 0) {
			char what[300];
			snprintf(what, sizeof(what), "buffer broadcast in %s group %s from group rank %d",
				 dptp_group_kind_name(g->kind), gs, root);
			dptp_result_fail(res, DPTP_FAIL, rc, &err, what);
			continue;
		}
		c->comm->ops->download(c->comm, host, data, sizeof(host));
		for (int i = 0; i < DATA_WORDS; i++) {
			if (host[i] != (uint32_t)dptp_mix64(nonce_of(c, g->kind, root, want) + (uint64_t)i)) {
				if (res->status < DPTP_FAIL)
					dptp_result_set(res, DPTP_FAIL,
						"buffer broadcast in %s group %s from group rank %d (global rank %d): "
						"word %d is 0x%08x, not the root's",
						dptp_group_kind_name(g->kind), gs, root, want, i, host[i]);
				break;
			}
		}
	}
	c->comm->ops->free(c->comm, data);
}

static void broadcast_run(struct dptp_ctx *c, struct dptp_check_result *res)
{
	int n = 0;
	res->status = DPTP_PASS;
	if (c->layout.tp > 1)
		run_group(c, &c->tp, c->layout.tp, res, &n);
	if (c->layout.pp > 1)
		run_group(c, &c->pp, c->layout.pp, res, &n);
	if (n == 0)
		dptp_result_set(res, DPTP_SKIP, "no group of two or more ranks inside a DP replica (tp = pp = 1)");
	else if (res->status == DPTP_PASS && c->x.b->rank >= 0)
		dptp_result_set(res, DPTP_PASS, "%d broadcasts from every root of the %s%s groups", n,
				c->layout.tp > 1 ? "TP" : "", c->layout.pp > 1 ? (c->layout.tp > 1 ? " and PP" : "PP") : "");
}

const struct dptp_check dptp_check_broadcast = {
	.name = "broadcast",
	.summary = "group broadcasts from every group-local root deliver that root's payload (objects and buffers)",
	.run = broadcast_run,
};
