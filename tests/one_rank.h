/* A one-rank job for unit tests: the single-process bootstrap, its
 * exchange, a 1-rank layout and its world group. */
#ifndef DPTP_TESTS_ONE_RANK_H
#define DPTP_TESTS_ONE_RANK_H

#include "plane/group.h"

struct one_rank {
	struct dptp_bootstrap *b;
	struct dptp_exchange x;
	struct dptp_layout l;
	struct dptp_group world;
};

/* 0, or -1 when the job cannot be built. */
int one_rank_init(struct one_rank *o);
void one_rank_release(struct one_rank *o);

#endif
