/* opid: every TP group's IPC opId is agreed by its members and unique among
 * the TP groups sharing a host -- proved by binding the abstract sockets for
 * real and passing a descriptor that names its sender around the group. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "checks/check.h"
#include "checks/ctx.h"
#include "ipc/workspace.h"

struct opid_rec {
	int32_t host;
	int32_t tp_first;  /* first member of the TP group: names the group */
	int32_t ok;
	int32_t pad;
	uint64_t opid;
};

/* A memfd whose content names its sender: the receiver reads it back. */
static int stamp_fd(int rank)
{
	int fd = memfd_create("dptp-opid", MFD_CLOEXEC);
	if (fd < 0)
		return -1;
	int32_t v = rank;
	if (pwrite(fd, &v, sizeof(v), 0) != sizeof(v)) {
		close(fd);
		return -1;
	}
	return fd;
}

/* What the collective steps got; verify reads it in the same order. */
struct state {
	uint64_t opid;
	bool have;                 /* the broadcast delivered an opId */
	bool spans;                /* the TP group spans hosts: no socket proof */
	uint64_t *all;             /* [tp size] the group's opIds */
	struct opid_rec me, *recs; /* [world] */
	struct dptp_ipcsock sock;
	int myfd, *in;             /* [tp size] descriptors received */
	int rc[5];                 /* broadcast, allgather, world allgather, socket, ring */
	struct dptp_err err[5];
};

static const char *opid_skip(const struct dptp_ctx *c)
{
	return c->layout.tp == 1 ? "TP size 1: no IPC workspace, so no opId" : NULL;
}

static int opid_prepare(struct dptp_ctx *c, void *state, struct dptp_err *err)
{
	struct state *s = state;
	s->sock.fd = -1;
	s->myfd = -1;
	s->all = calloc((size_t)c->tp.size, sizeof(uint64_t));
	s->recs = calloc((size_t)c->layout.world, sizeof(*s->recs));
	s->in = calloc((size_t)c->tp.size, sizeof(int));
	if (!s->all || !s->recs || !s->in)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	for (int j = 0; j < c->tp.size; j++)
		s->in[j] = -1;
	return 0;
}

static void opid_run(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	const struct dptp_group *tp = &c->tp;
	/* 1. the TP root draws the opId and broadcasts it in its group */
	s->rc[0] = dptp_opid_agree(&c->ipc, tp, tp->index, &s->opid, &s->err[0]);
	s->have = s->rc[0] == 0;
	/* 2. every member's opId */
	s->rc[1] = dptp_xchg_allgather(&c->x, tp, &s->opid, sizeof(s->opid), s->all, &s->err[1]);
	/* 3. every rank's, with its host and TP group */
	s->me = (struct opid_rec){ .host = c->host_of[c->rank], .tp_first = tp->ranks[0], .ok = s->have,
				   .opid = s->opid };
	s->rc[2] = dptp_xchg_allgather(&c->x, &c->world, &s->me, sizeof(s->me), s->recs, &s->err[2]);
	/* 4. the proof: bind the sockets for real, pass a descriptor that
	 * names its sender around the group */
	for (int i = 0; i < tp->size; i++)
		s->spans |= c->host_of[tp->ranks[i]] != c->host_of[c->rank];
	if (!s->spans) {
		s->rc[3] = dptp_ipc_bind(&c->ipc, &s->sock, tp->index, s->opid, &s->err[3]);
		if (s->rc[3] < 0) {
			char gs[256];
			dptp_group_format(tp, gs, sizeof(gs));
			dptp_err_prefix(&s->err[3], "global rank %d (TP group %s)", c->rank, gs);
		}
	} else {
		dptp_ipcsock_name(s->sock.name, sizeof(s->sock.name), tp->index, s->opid);
	}
	s->sock.opid = s->opid;
	s->myfd = stamp_fd(c->rank);
	int *inp[1] = { s->in };
	s->rc[4] = dptp_fd_ring(&c->ipc, tp, tp->index, tp->size, &s->sock, 1, &s->myfd, inp, &s->err[4]);
}

static void opid_verify(struct dptp_ctx *c, void *state, int round, struct dptp_check_result *res)
{
	struct state *s = state;
	const struct dptp_group *tp = &c->tp;
	char gs[256];
	dptp_group_format(tp, gs, sizeof(gs));
	if (s->rc[0] < 0)
		dptp_result_fail(res, DPTP_FAIL, s->rc[0], &s->err[0], "opId broadcast in TP group");
	/* every member agrees */
	if (s->rc[1] < 0)
		dptp_result_fail(res, DPTP_FAIL, s->rc[1], &s->err[1], "opId allgather in TP group");
	for (int i = 0; s->rc[1] == 0 && s->have && i < tp->size; i++)
		if (s->all[i] != s->opid && res->status < DPTP_FAIL)
			dptp_result_set(res, DPTP_FAIL, "TP group %s disagrees on its opId: group rank %d has %llx, this rank %llx",
					gs, i, (unsigned long long)s->all[i], (unsigned long long)s->opid);
	/* unique among the TP groups on this host (and the job's other hosts) */
	if (s->rc[2] < 0)
		dptp_result_fail(res, DPTP_FAIL, s->rc[2], &s->err[2], "opId allgather over the world");
	for (int r = 0; s->rc[2] == 0 && s->have && r < c->layout.world; r++) {
		const struct opid_rec *o = &s->recs[r];
		if (!o->ok || o->tp_first == s->me.tp_first || o->host != s->me.host || o->opid != s->opid)
			continue;
		if (res->status < DPTP_FAIL)
			dptp_result_set(res, DPTP_FAIL,
				"opId %llx is shared by TP groups of ranks %d and %d on host %s: their IPC sockets collide",
				(unsigned long long)s->opid, s->me.tp_first, o->tp_first, c->peers[c->rank].hostname);
		break;
	}
	/* the sockets, and who each descriptor came from */
	if (s->rc[3] < 0)
		dptp_result_fail(res, DPTP_FAIL, s->rc[3], &s->err[3], "socket");
	if (s->rc[4] < 0 && !s->spans)
		dptp_result_fail(res, DPTP_FAIL, s->rc[4], &s->err[4], "descriptor ring");
	for (int j = 0; j < tp->size; j++) {
		if (s->in[j] < 0)
			continue;
		int32_t who = -1;
		if ((pread(s->in[j], &who, sizeof(who), 0) != sizeof(who) || who != tp->ranks[j]) &&
		    res->status < DPTP_FAIL)
			dptp_result_set(res, DPTP_FAIL,
				"the descriptor from group rank %d names global rank %d, expected %d",
				j, who, tp->ranks[j]);
	}
	if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, s->spans
			? "opId %llx agreed and unique; socket proof skipped: TP group %s spans hosts"
			: "opId %llx agreed, unique on host, socket '@%s' bound and descriptors came from the right ranks",
			(unsigned long long)s->opid, s->spans ? gs : s->sock.name);
}

static void opid_release(struct dptp_ctx *c, void *state)
{
	struct state *s = state;
	for (int j = 0; s->in && j < c->tp.size; j++)
		if (s->in[j] >= 0)
			close(s->in[j]);
	if (s->myfd >= 0)
		close(s->myfd);
	dptp_ipcsock_close(&s->sock);
	free(s->in);
	free(s->all);
	free(s->recs);
}

const struct dptp_check dptp_check_opid = {
	.name = "opid",
	.summary = "each TP group's IPC opId is agreed and unique on its host (sockets bound, descriptors passed)",
	.mech = "I",
	.skip = opid_skip,
	.state_size = sizeof(struct state),
	.prepare = opid_prepare,
	.run = opid_run,
	.verify = opid_verify,
	.release = opid_release,
};
