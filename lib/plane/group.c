#include "plane/group.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dptp_group_init(struct dptp_group *g, const struct dptp_layout *l,
		    enum dptp_group_kind kind, int rank)
{
	memset(g, 0, sizeof(*g));
	g->ranks = calloc((size_t)l->world, sizeof(int));
	if (!g->ranks)
		return -ENOMEM;
	g->kind = kind;
	g->size = dptp_layout_group(l, kind, rank, g->ranks, &g->index);
	return 0;
}

void dptp_group_release(struct dptp_group *g)
{
	if (!g)
		return;
	free(g->ranks);
	g->ranks = NULL;
	g->size = 0;
}

int dptp_group_to_global(const struct dptp_group *g, int local, struct dptp_err *err)
{
	if (local < 0 || local >= g->size) {
		char s[256];
		dptp_group_format(g, s, sizeof(s));
		return dptp_err_set(err, -EINVAL, "group rank %d is out of range for group %s", local, s);
	}
	return g->ranks[local];
}

int dptp_group_index_of(const struct dptp_group *g, int global)
{
	for (int i = 0; i < g->size; i++)
		if (g->ranks[i] == global)
			return i;
	return -1;
}

void dptp_group_format(const struct dptp_group *g, char *buf, size_t n)
{
	size_t off = 0;
	off += (size_t)snprintf(buf + off, n - off, "[");
	for (int i = 0; i < g->size && off < n; i++) {
		if (i == 8 && g->size > 10) {
			off += (size_t)snprintf(buf + off, n - off, ", ..., %d", g->ranks[g->size - 1]);
			break;
		}
		off += (size_t)snprintf(buf + off, n - off, "%s%d", i ? ", " : "", g->ranks[i]);
	}
	if (off < n)
		snprintf(buf + off, n - off, "]");
}

void dptp_exchange_init(struct dptp_exchange *x, struct dptp_bootstrap *b, bool root_as_global)
{
	memset(x, 0, sizeof(*x));
	x->b = b;
	x->deadline = dptp_now() + 3600;
	x->root_as_global = root_as_global;
}

int dptp_xchg_root_src(const struct dptp_exchange *x, const struct dptp_group *g, int root)
{
	if (x->root_as_global)
		return root; /* bug 2: the group-local root handed over as a global rank */
	return g->ranks[root >= 0 && root < g->size ? root : 0];
}

static void key_of(char *key, size_t n, uint64_t seq)
{
	snprintf(key, n, "dptp.x.%llu", (unsigned long long)seq);
}

int dptp_xchg_round(struct dptp_exchange *x, const void *mine, size_t len, struct dptp_err *err)
{
	x->seq++;
	if (x->broken)
		return dptp_err_set(err, -ETIMEDOUT, "not attempted: an earlier collective timed out");
	if (mine) {
		char key[64];
		key_of(key, sizeof(key), x->seq);
		DPTP_TRY(dptp_bootstrap_put(x->b, key, mine, len, err));
	}
	int rc = dptp_bootstrap_fence(x->b, x->deadline - dptp_now(), err);
	if (rc == -ETIMEDOUT)
		x->broken = true;
	return rc;
}

int dptp_xchg_fetch(struct dptp_exchange *x, int rank, void *out, size_t len, struct dptp_err *err)
{
	char key[64];
	key_of(key, sizeof(key), x->seq);
	void *data = NULL;
	size_t n = 0;
	DPTP_TRY(dptp_bootstrap_get(x->b, rank, key, &data, &n, x->deadline - dptp_now(), err));
	if (n != len) {
		free(data);
		return dptp_err_set(err, -EPROTO, "rank %d sent %zu bytes, expected %zu", rank, n, len);
	}
	memcpy(out, data, len);
	free(data);
	return 0;
}

bool dptp_xchg_is_root(const struct dptp_exchange *x, const struct dptp_group *g, int src_global)
{
	if (x->root_by_local_rank)
		return g->index == src_global; /* the group-local rank compared with a global src */
	return x->b->rank == src_global;
}

/* A member's part of a broadcast round: a flag byte (1: acted as root),
 * then, after a 1, the payload. */
static int fetch_part(struct dptp_exchange *x, int rank, void *buf, size_t len, bool *acted,
		      struct dptp_err *err)
{
	char key[64];
	key_of(key, sizeof(key), x->seq);
	void *data = NULL;
	size_t n = 0;
	double left = x->deadline - dptp_now();
	DPTP_TRY(dptp_bootstrap_get(x->b, rank, key, &data, &n, left < DPTP_XCHG_OP_DEADLINE ? left :
				    DPTP_XCHG_OP_DEADLINE, err));
	int rc = 0;
	*acted = n >= 1 && ((unsigned char *)data)[0] == 1;
	if (*acted && n != len + 1)
		rc = dptp_err_set(err, -EPROTO, "rank %d sent %zu bytes, expected %zu", rank, n - 1, len);
	else if (*acted)
		memcpy(buf, (unsigned char *)data + 1, len);
	free(data);
	return rc;
}

int dptp_xchg_bcast(struct dptp_exchange *x, const struct dptp_group *g, int src_global,
		    void *buf, size_t len, struct dptp_err *err)
{
	int me = x->b->rank;
	int member = dptp_group_index_of(g, src_global) >= 0;
	bool mine = g->index >= 0 && dptp_group_index_of(g, me) >= 0;
	bool acts = mine && member && dptp_xchg_is_root(x, g, src_global);
	/* every member stages its part: a flag, and the payload when it acts */
	unsigned char *part = mine ? malloc(len + 1) : NULL;
	if (mine && !part) {
		dptp_xchg_round(x, NULL, 0, NULL); /* stay in lockstep */
		return dptp_err_set(err, -ENOMEM, "out of memory");
	}
	if (part) {
		part[0] = acts;
		if (acts)
			memcpy(part + 1, buf, len);
	}
	/* stay in lockstep: every rank takes part in the round, even when its
	 * own call is refused */
	int rc = dptp_xchg_round(x, part, acts ? len + 1 : 1, err);
	free(part);
	char s[256];
	if (!member) {
		dptp_group_format(g, s, sizeof(s));
		return dptp_err_set(err, -EINVAL, "global rank %d is not part of group %s", src_global, s);
	}
	if (rc < 0 || acts)
		return rc;
	/* receive from the source; if it did not act, from whichever member did */
	bool acted = false;
	DPTP_TRY(fetch_part(x, src_global, buf, len, &acted, err));
	for (int i = 0; !acted && i < g->size; i++)
		if (g->ranks[i] != src_global)
			DPTP_TRY(fetch_part(x, g->ranks[i], buf, len, &acted, err));
	if (acted)
		return 0;
	dptp_group_format(g, s, sizeof(s));
	return dptp_err_set(err, -ENODATA, "no rank of group %s acted as root of a broadcast from global rank %d",
			    s, src_global);
}

int dptp_xchg_bcast_root(struct dptp_exchange *x, const struct dptp_group *g, int root,
			 void *buf, size_t len, struct dptp_err *err)
{
	return dptp_xchg_bcast(x, g, dptp_xchg_root_src(x, g, root), buf, len, err);
}

int dptp_xchg_allgather(struct dptp_exchange *x, const struct dptp_group *g,
			const void *mine, size_t len, void *out, struct dptp_err *err)
{
	DPTP_TRY(dptp_xchg_round(x, mine, len, err));
	unsigned char *o = out;
	for (int i = 0; i < g->size; i++) {
		if (g->ranks[i] == x->b->rank)
			memcpy(o + (size_t)i * len, mine, len);
		else
			DPTP_TRY(dptp_xchg_fetch(x, g->ranks[i], o + (size_t)i * len, len, err));
	}
	return 0;
}

int dptp_xchg_barrier(struct dptp_exchange *x, const struct dptp_group *g, struct dptp_err *err)
{
	return dptp_xchg_round(x, NULL, 0, err);
}
