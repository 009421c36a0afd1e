#include "plane/comm.h"

#include <errno.h>
#include <stdio.h>

DPTP_HOT void dptp_reduce_sum(void *out, const void *const *in, int n, size_t count, enum dptp_dtype dt)
{
	/* out may be one of in: a block is summed completely before it is stored */
	float acc[2048];
	const size_t esz = dptp_dtype_bytes(dt);
	for (size_t base = 0; base < count; base += 2048) {
		size_t m = count - base < 2048 ? count - base : 2048;
		memset(acc, 0, m * sizeof(float));
		for (int r = 0; r < n; r++)
			dptp_add_f32(acc, (const char *)in[r] + base * esz, m, dt);
		dptp_store_f32((char *)out + base * esz, acc, m, dt);
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
