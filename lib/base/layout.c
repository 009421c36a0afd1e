#include "base/layout.h"

#include <errno.h>

int dptp_layout_init(struct dptp_layout *l, int world, int dp, int pp, int tp,
		     struct dptp_err *err)
{
	if (world < 1 || world > DPTP_MAX_WORLD)
		return dptp_err_set(err, -EINVAL, "world size %d is out of range 1..%d", world, DPTP_MAX_WORLD);
	if (tp < 0 || pp < 0 || dp < 0)
		return dptp_err_set(err, -EINVAL, "negative group size (dp=%d pp=%d tp=%d)", dp, pp, tp);
	if (tp == 0)
		tp = 1;
	if (pp == 0)
		pp = 1;
	/* products of sizes up to INT_MAX: in 64 bits, never wrapped */
	int64_t tpp = (int64_t)tp * pp;
	if (dp == 0) {
		if (world % tpp)
			return dptp_err_set(err, -EINVAL,
				"world size %d is not divisible by tp*pp = %d*%d = %lld",
				world, tp, pp, (long long)tpp);
		dp = (int)(world / tpp);
	}
	if (tpp > world) /* and tpp * dp might not fit even in 64 bits */
		return dptp_err_set(err, -EINVAL,
			"dp*pp*tp = %d*%d*%d is more than the world size %d", dp, pp, tp, world);
	int64_t all = tpp * dp;
	if (all != world)
		return dptp_err_set(err, -EINVAL,
			"dp*pp*tp = %d*%d*%d = %lld does not match the world size %d",
			dp, pp, tp, (long long)all, world);
	l->world = world;
	l->dp = dp;
	l->pp = pp;
	l->tp = tp;
	return 0;
}

struct dptp_coord dptp_layout_coord(const struct dptp_layout *l, int rank)
{
	struct dptp_coord c;
	c.tp = rank % l->tp;
	c.pp = (rank / l->tp) % l->pp;
	c.dp = rank / (l->tp * l->pp);
	return c;
}

int dptp_layout_rank(const struct dptp_layout *l, struct dptp_coord c)
{
	return (c.dp * l->pp + c.pp) * l->tp + c.tp;
}

int dptp_layout_group(const struct dptp_layout *l, enum dptp_group_kind kind,
		      int rank, int *ranks, int *my_index)
{
	struct dptp_coord me = dptp_layout_coord(l, rank), c = me;
	int n = 0, idx = 0;
	switch (kind) {
	case DPTP_GROUP_TP:
		for (c.tp = 0; c.tp < l->tp; c.tp++)
			ranks[n++] = dptp_layout_rank(l, c);
		idx = me.tp;
		break;
	case DPTP_GROUP_PP:
		for (c.pp = 0; c.pp < l->pp; c.pp++)
			ranks[n++] = dptp_layout_rank(l, c);
		idx = me.pp;
		break;
	case DPTP_GROUP_DP:
		for (c.dp = 0; c.dp < l->dp; c.dp++)
			ranks[n++] = dptp_layout_rank(l, c);
		idx = me.dp;
		break;
	case DPTP_GROUP_EP:
		/* all dp*tp ranks of my pp stage, ordered by (dp, tp) */
		for (c.dp = 0; c.dp < l->dp; c.dp++)
			for (c.tp = 0; c.tp < l->tp; c.tp++)
				ranks[n++] = dptp_layout_rank(l, c);
		idx = me.dp * l->tp + me.tp;
		break;
	case DPTP_GROUP_WORLD:
		for (n = 0; n < l->world; n++)
			ranks[n] = n;
		idx = rank;
		break;
	}
	if (my_index)
		*my_index = idx;
	return n;
}

int dptp_layout_ngroups(const struct dptp_layout *l, enum dptp_group_kind kind)
{
	switch (kind) {
	case DPTP_GROUP_TP: return l->world / l->tp;
	case DPTP_GROUP_PP: return l->world / l->pp;
	case DPTP_GROUP_DP: return l->world / l->dp;
	case DPTP_GROUP_EP: return l->pp;
	case DPTP_GROUP_WORLD: return 1;
	}
	return 0;
}

int dptp_layout_group_at(const struct dptp_layout *l, enum dptp_group_kind kind,
			 int index, int *ranks)
{
	/* find the index-th distinct group by scanning ranks in order and
	 * keeping those that are the first member of their group */
	int seen = 0;
	for (int r = 0; r < l->world; r++) {
		int n = dptp_layout_group(l, kind, r, ranks, NULL);
		if (ranks[0] != r)
			continue;
		if (seen++ == index)
			return n;
	}
	return 0;
}

const char *dptp_group_kind_name(enum dptp_group_kind kind)
{
	switch (kind) {
	case DPTP_GROUP_TP: return "tp";
	case DPTP_GROUP_PP: return "pp";
	case DPTP_GROUP_DP: return "dp";
	case DPTP_GROUP_EP: return "ep";
	case DPTP_GROUP_WORLD: return "world";
	}
	return "?";
}
