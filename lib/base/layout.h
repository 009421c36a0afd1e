/* World -> (dp, pp, tp) coordinates and group member lists in vLLM's order:
 * global ranks are arange(world).reshape(dp, pp, tp).
 *   TP group: consecutive blocks of tp ranks
 *   PP group: same (dp, tp), stepping by tp
 *   DP group: same (pp, tp), stepping by pp*tp
 *   EP group: all dp*tp ranks of one pp stage */
#ifndef DPTP_LIB_LAYOUT_H
#define DPTP_LIB_LAYOUT_H

#include "base/util.h"

#define DPTP_MAX_WORLD 4096

enum dptp_group_kind {
	DPTP_GROUP_TP,
	DPTP_GROUP_PP,
	DPTP_GROUP_DP,
	DPTP_GROUP_EP,
	DPTP_GROUP_WORLD,
};

struct dptp_layout {
	int world, dp, pp, tp;
};

struct dptp_coord {
	int dp, pp, tp;
};

/* Validates and fills *l. dp/pp/tp of 0 mean "derive": tp and pp default to
 * 1 and dp to world/(tp*pp). A product that differs from world is refused
 * with a message naming the numbers. Returns 0 or -EINVAL. */
int dptp_layout_init(struct dptp_layout *l, int world, int dp, int pp, int tp,
		     struct dptp_err *err);

struct dptp_coord dptp_layout_coord(const struct dptp_layout *l, int rank);
int dptp_layout_rank(const struct dptp_layout *l, struct dptp_coord c);

/* Member list of `rank`'s group of `kind`, in group-rank order, written to
 * ranks[] (room for l->world); returns the group size. *my_index, if not
 * NULL, gets rank's index within the group. */
int dptp_layout_group(const struct dptp_layout *l, enum dptp_group_kind kind,
		      int rank, int *ranks, int *my_index);

/* Number of distinct groups of a kind and the i-th group's members (groups
 * numbered by their first member). Returns size. */
int dptp_layout_ngroups(const struct dptp_layout *l, enum dptp_group_kind kind);
int dptp_layout_group_at(const struct dptp_layout *l, enum dptp_group_kind kind,
			 int index, int *ranks);

const char *dptp_group_kind_name(enum dptp_group_kind kind);

#endif
