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

static void opid_run(struct dptp_ctx *c, struct dptp_check_result *res)
{
	struct dptp_err err = {0};
	const struct dptp_group *tp = &c->tp;
	char gs[256];
	dptp_group_format(tp, gs, sizeof(gs));
	if (c->layout.tp == 1) {
		dptp_result_set(res, DPTP_SKIP, "TP size 1: no IPC workspace, so no opId");
		return;
	}
	res->status = DPTP_PASS;
	/* 1. the TP root draws the opId and broadcasts it in its group */
	uint64_t opid = tp->index == 0 ? dptp_opid_draw(c) : 0;
	int rc = dptp_xchg_bcast_root(&c->x, tp, 0, &opid, sizeof(opid), c->p.faults, &err);
	bool have = rc == 0;
	if (rc < 0)
		dptp_result_fail(res, DPTP_FAIL, rc, &err, "opId broadcast in TP group");

	/* 2. every member agrees */
	uint64_t *all = calloc((size_t)tp->size, sizeof(uint64_t));
	struct opid_rec *recs = calloc((size_t)c->layout.world, sizeof(*recs));
	if (!all || !recs) {
		dptp_result_set(res, DPTP_ERROR, "out of memory");
		free(all);
		free(recs);
		return;
	}
	rc = dptp_xchg_allgather(&c->x, tp, &opid, sizeof(opid), all, &err);
	if (rc < 0)
		dptp_result_fail(res, DPTP_FAIL, rc, &err, "opId allgather in TP group");
	for (int i = 0; rc == 0 && have && i < tp->size; i++)
		if (all[i] != opid && res->status < DPTP_FAIL)
			dptp_result_set(res, DPTP_FAIL, "TP group %s disagrees on its opId: group rank %d has %llx, this rank %llx",
					gs, i, (unsigned long long)all[i], (unsigned long long)opid);

	/* 3. unique among the TP groups on this host (and the job's other hosts) */
	struct opid_rec me = { .host = c->host_of[c->rank], .tp_first = tp->ranks[0], .ok = have, .opid = opid };
	rc = dptp_xchg_allgather(&c->x, &c->world, &me, sizeof(me), recs, &err);
	if (rc < 0)
		dptp_result_fail(res, DPTP_FAIL, rc, &err, "opId allgather over the world");
	for (int r = 0; rc == 0 && have && r < c->layout.world; r++) {
		if (!recs[r].ok || recs[r].tp_first == me.tp_first || recs[r].host != me.host ||
		    recs[r].opid != opid)
			continue;
		if (res->status < DPTP_FAIL)
			dptp_result_set(res, DPTP_FAIL,
				"opId %llx is shared by TP groups of ranks %d and %d on host %s: their IPC sockets collide",
				(unsigned long long)opid, me.tp_first, recs[r].tp_first, c->peers[c->rank].hostname);
		break;
	}

	/* 4. the proof: bind the sockets for real, pass a descriptor that
	 * names its sender around the group, and see who it came from */
	bool spans = false;
	for (int i = 0; i < tp->size; i++)
		spans |= c->host_of[tp->ranks[i]] != c->host_of[c->rank];
	struct dptp_ipcsock sock = { .fd = -1 };
	if (!spans) {
		rc = dptp_ipcsock_bind(&sock, tp->index, opid, &err);
		if (rc < 0) {
			dptp_err_prefix(&err, "global rank %d (TP group %s)", c->rank, gs);
			dptp_result_fail(res, DPTP_FAIL, rc, &err, "socket");
		}
	} else {
		dptp_ipcsock_name(sock.name, sizeof(sock.name), tp->index, opid);
	}
	sock.opid = opid;
	int myfd = stamp_fd(c->rank);
	int *in = calloc((size_t)tp->size, sizeof(int));
	int *inp[1] = { in };
	rc = in ? dptp_fd_ring(c, tp, tp->index, tp->size, &sock, 1, &myfd, inp, &err) : -ENOMEM;
	if (rc < 0 && !spans)
		dptp_result_fail(res, DPTP_FAIL, rc, &err, "descriptor ring");
	for (int j = 0; in && j < tp->size; j++) {
		if (in[j] < 0)
			continue;
		int32_t who = -1;
		if (pread(in[j], &who, sizeof(who), 0) != sizeof(who) || who != tp->ranks[j]) {
			if (res->status < DPTP_FAIL)
				dptp_result_set(res, DPTP_FAIL,
					"the descriptor from group rank %d names global rank %d, expected %d",
					j, who, tp->ranks[j]);
		}
		close(in[j]);
	}
	if (myfd >= 0)
		close(myfd);
	dptp_ipcsock_close(&sock);
	if (res->status == DPTP_PASS)
		dptp_result_set(res, DPTP_PASS, spans
			? "opId %llx agreed and unique; socket proof skipped: TP group %s spans hosts"
			: "opId %llx agreed, unique on host, socket '@%s' bound and descriptors came from the right ranks",
			(unsigned long long)opid, spans ? gs : sock.name);
	free(in);
	free(all);
	free(recs);
}

const struct dptp_check dptp_check_opid = {
	.name = "opid",
	.summary = "each TP group's IPC opId is agreed and unique on its host (sockets bound, descriptors passed)",
	.run = opid_run,
};
