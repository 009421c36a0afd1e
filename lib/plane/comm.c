#include "plane/comm.h"

#include <errno.h>
#include <stdio.h>

void dptp_reduce_sum(void *out, const void *const *in, int n, size_t count, enum dptp_dtype dt)
{
	for (size_t i = 0; i < count; i++) {
		float s = 0.0f;
		for (int r = 0; r < n; r++)
			s += dptp_load_elt(in[r], i, dt);
		dptp_store_elt(out, i, s, dt);
	}
}

void dptp_comm_destroy(struct dptp_comm *c)
{
	if (c && c->ops)
		c->ops->destroy(c);
}

int dptp_xchg_bcast_buf(struct dptp_exchange *x, struct dptp_comm *c, const struct dptp_group *g,
			int root, void *buf, size_t bytes, struct dptp_err *err)
{
	int src = dptp_xchg_root_src(x, g, root);
	int idx = dptp_group_index_of(g, src);
	/* torch refuses a source outside the group; the rounds still run so
	 * that every rank stays in lockstep */
	int rc = c->ops->bcast(c, g, buf, bytes, idx, err);
	if (idx < 0) {
		char s[256];
		dptp_group_format(g, s, sizeof(s));
		return dptp_err_set(err, -EINVAL, "global rank %d is not part of group %s", src, s);
	}
	return rc;
}
