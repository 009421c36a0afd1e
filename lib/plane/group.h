/* Process groups and the two layers the bugs live in.
 *
 * The *coordinator* (vLLM's GroupCoordinator) holds a group and converts a
 * group-local root to a global rank with dptp_group_to_global().
 *
 * The *exchange backend* (flashinfer's CommBackend) moves small objects over
 * a group on the bootstrap: bcast, allgather, barrier. Its bcast is
 * torch-style: it takes a GLOBAL source rank and refuses one that is not a
 * member ("global rank 0 is not part of group [2, 3]").
 *
 * Every exchange op is collective over the whole world underneath (one
 * world fence), so ranks must call them in lockstep: the same sequence of
 * ops on every rank, whatever group each rank passes. */
#ifndef DPTP_LIB_GROUP_H
#define DPTP_LIB_GROUP_H

#include <stdbool.h>

#include "bootstrap/bootstrap.h"
#include "base/layout.h"

struct dptp_group {
	enum dptp_group_kind kind;
	int size;
	int *ranks;  /* owned, group order */
	int index;   /* this rank's index, -1 if not a member */
};

/* The group of `kind` that `rank` belongs to. Release with _release. */
int dptp_group_init(struct dptp_group *g, const struct dptp_layout *l,
		    enum dptp_group_kind kind, int rank);
void dptp_group_release(struct dptp_group *g);

/* Group-local index -> global rank; -EINVAL with a message when out of range. */
int dptp_group_to_global(const struct dptp_group *g, int local, struct dptp_err *err);
/* Global rank -> group index, or -1. */
int dptp_group_index_of(const struct dptp_group *g, int global);
/* "[2, 3]" */
void dptp_group_format(const struct dptp_group *g, char *buf, size_t n);

/* What every rank knows about every other, from one allgather at start. */
struct dptp_peer {
	int32_t host;            /* dense host index (ranks sharing memory) */
	int32_t local_rank;
	int32_t pid;
	int32_t device;          /* device this rank would use (-1 unknown) */
	uint64_t nonce;          /* random; rank 0's names this attempt (ctx.attempt) */
	char hostname[64];
};

struct dptp_exchange {
	struct dptp_bootstrap *b;
	uint64_t seq;
	double deadline;  /* absolute dptp_now() time; ops fail with -ETIMEDOUT after it */
	bool broken;      /* a fence timed out: lockstep is lost, later ops fail fast */
	bool root_as_global; /* bug 2's backend: see dptp_xchg_root_src() */
	bool root_by_local_rank; /* root-by-local-rank: see dptp_xchg_is_root() */
};

/* root_as_global makes this instance the buggy backend of bug 2 (in the real
 * stack the buggy backend is a different object from the coordinator). */
void dptp_exchange_init(struct dptp_exchange *x, struct dptp_bootstrap *b, bool root_as_global);

/* The source rank a broadcast from group-local root `root` uses: the root's
 * global rank -- or, in the root_as_global backend, root itself read as a
 * global rank (bug 2, the one place it acts). */
int dptp_xchg_root_src(const struct dptp_exchange *x, const struct dptp_group *g, int root);

/* The "am I the root?" test of a broadcast from global rank src: this
 * rank's global rank equals src -- or, in the root_by_local_rank backend,
 * its group-local rank does (tokenspeed PR 786, PyTorch issue 130515: the
 * mirror image of bug 2; the one place it acts). */
bool dptp_xchg_is_root(const struct dptp_exchange *x, const struct dptp_group *g, int src_global);

/* Per-operation bound of a broadcast's receive (seconds, within the
 * exchange deadline): after the round's fence the root's data is there or
 * never will be. */
#define DPTP_XCHG_OP_DEADLINE 2.0

/* Torch-style broadcast of len bytes from global rank src to the members of
 * g. The member that passes dptp_xchg_is_root() acts as root and sends; the
 * others receive what it sent. When no member acted, -ENODATA: "no rank of
 * group [2, 3] acted as root of a broadcast from global rank 2". */
int dptp_xchg_bcast(struct dptp_exchange *x, const struct dptp_group *g, int src_global,
		    void *buf, size_t len, struct dptp_err *err);
/* flashinfer-style broadcast from a group-local root, with the source from
 * dptp_xchg_root_src(). */
int dptp_xchg_bcast_root(struct dptp_exchange *x, const struct dptp_group *g, int root,
			 void *buf, size_t len, struct dptp_err *err);
/* out receives g->size * len bytes in group order. */
int dptp_xchg_allgather(struct dptp_exchange *x, const struct dptp_group *g,
			const void *mine, size_t len, void *out, struct dptp_err *err);
int dptp_xchg_barrier(struct dptp_exchange *x, const struct dptp_group *g, struct dptp_err *err);

/* Lower level, for the data plane: stage a blob for this round, fence, and
 * fetch a peer's blob of the same round. */
int dptp_xchg_round(struct dptp_exchange *x, const void *mine, size_t len, struct dptp_err *err);
int dptp_xchg_fetch(struct dptp_exchange *x, int rank, void *out, size_t len, struct dptp_err *err);

#endif
