#include "one_rank.h"

#include <string.h>

int one_rank_init(struct one_rank *o)
{
	struct dptp_err err = {0};
	memset(o, 0, sizeof(*o));
	if (dptp_bootstrap_single_create(&o->b, &err) < 0 || dptp_layout_init(&o->l, 1, 1, 1, 1, &err) < 0 ||
	    dptp_group_init(&o->world, &o->l, DPTP_GROUP_WORLD, 0) < 0)
		return -1;
	dptp_exchange_init(&o->x, o->b, false);
	return 0;
}

void one_rank_release(struct one_rank *o)
{
	dptp_group_release(&o->world);
	dptp_bootstrap_destroy(o->b);
}
