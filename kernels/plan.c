#include "plan.h"

#include <errno.h>
#include <stdio.h>

#define ALIGN 256u

static size_t round_up(size_t v, size_t a)
{
	return (v + a - 1) / a * a;
}

static int valid_nranks(int n)
{
	return n == 1 || n == 2 || n == 4 || n == 8;
}

static int seterr(struct dptp_err *err, const char *msg)
{
	if (err)
		snprintf(err->msg, sizeof(err->msg), "%s", msg);
	return -EINVAL;
}

size_t dptp_cuda_ar_max_hidden(enum dptp_dtype dt)
{
	/* 512 threads x 8 vectors of 16 bytes. */
	return 512u * 8u * (16u / dptp_dtype_bytes(dt));
}

const char *dptp_ar_algo_name(enum dptp_ar_algo a)
{
	switch (a) {
	case DPTP_AR_AUTO: return "auto";
	case DPTP_AR_ONESHOT: return "oneshot";
	case DPTP_AR_TWOSHOT: return "twoshot";
	case DPTP_AR_NORM_ONLY: return "norm";
	}
	return "?";
}

size_t dptp_ar_oneshot_max_bytes(int nranks)
{
	switch (nranks) {
	case 2: return (size_t)32 << 20;
	case 4: return (size_t)2 << 20;
	case 8: return (size_t)512 << 10;
	default: return 0;
	}
}

enum dptp_ar_algo dptp_ar_choose(int nranks, size_t tokens, size_t hidden, enum dptp_dtype dt)
{
	if (nranks <= 1)
		return DPTP_AR_NORM_ONLY;
	size_t bytes = tokens * hidden * dptp_dtype_bytes(dt);
	if (bytes <= dptp_ar_oneshot_max_bytes(nranks) || tokens < (size_t)nranks)
		return DPTP_AR_ONESHOT;
	return DPTP_AR_TWOSHOT;
}

int dptp_ar_validate(int nranks, size_t tokens, size_t hidden, enum dptp_dtype dt,
		     size_t max_bytes, enum dptp_ar_algo algo, struct dptp_err *err)
{
	char msg[160];
	if (!valid_nranks(nranks)) {
		snprintf(msg, sizeof(msg), "ranks %d: the fused kernels take 1, 2, 4 or 8", nranks);
		return seterr(err, msg);
	}
	if (dt != DPTP_DTYPE_BF16 && dt != DPTP_DTYPE_FP16 && dt != DPTP_DTYPE_FP32)
		return seterr(err, "unknown dtype");
	if (hidden == 0 || hidden % 8 || hidden > dptp_cuda_ar_max_hidden(dt)) {
		snprintf(msg, sizeof(msg), "hidden %zu: must be a positive multiple of 8, at most %zu",
			 hidden, dptp_cuda_ar_max_hidden(dt));
		return seterr(err, msg);
	}
	if (tokens == 0 || tokens > ((size_t)1 << 31))
		return seterr(err, "tokens must be at least 1");
	size_t bytes = tokens * hidden * dptp_dtype_bytes(dt);
	if (max_bytes && bytes > max_bytes) {
		snprintf(msg, sizeof(msg), "%zu tokens x %zu hidden = %zu bytes: the workspace holds %zu",
			 tokens, hidden, bytes, max_bytes);
		return seterr(err, msg);
	}
	if (algo == DPTP_AR_NORM_ONLY && nranks > 1)
		return seterr(err, "norm-only does not communicate: it needs ranks 1");
	if (algo == DPTP_AR_TWOSHOT && nranks > 1 && tokens < (size_t)nranks) {
		snprintf(msg, sizeof(msg), "two-shot needs tokens >= ranks (%zu < %d)", tokens, nranks);
		return seterr(err, msg);
	}
	return 0;
}

int dptp_ar_layout_get(int nranks, size_t max_bytes, struct dptp_ar_layout *l)
{
	if (!valid_nranks(nranks) || max_bytes == 0 || max_bytes > ((size_t)1 << 40))
		return -EINVAL;
	size_t slot = round_up(max_bytes, ALIGN);
	size_t off = 0;
	l->slot_bytes = slot;
	for (int i = 0; i < 3; i++) {
		l->lamport[i] = off;
		off += slot * (size_t)nranks;
	}
	l->scatter = off;
	off += slot * (size_t)nranks;
	l->gather_res = off;
	off += slot;
	l->gather_norm = off;
	off += slot;
	l->flags = off;
	off += round_up(2u * DPTP_AR_MAX_BLOCKS * DPTP_AR_MAX_RANKS * sizeof(unsigned), ALIGN);
	l->total = off;
	return 0;
}

size_t dptp_cuda_ar_buffer_bytes(int nranks, size_t max_bytes)
{
	struct dptp_ar_layout l;
	return dptp_ar_layout_get(nranks, max_bytes, &l) ? 0 : l.total;
}

int dptp_ar_shape_get(size_t hidden, enum dptp_dtype dt, struct dptp_ar_shape *s)
{
	/* as few vectors per thread as 512 threads allow */
	return dptp_ar_norm_shape_get(hidden, dt, 1, s);
}

int dptp_ar_norm_shape_get(size_t hidden, enum dptp_dtype dt, int vpt_min, struct dptp_ar_shape *s)
{
	size_t per_vec = 16 / dptp_dtype_bytes(dt);
	if (hidden == 0 || hidden % 8 || hidden > dptp_cuda_ar_max_hidden(dt) ||
	    (vpt_min != 1 && vpt_min != 2 && vpt_min != 4 && vpt_min != 8))
		return -EINVAL;
	size_t hv = hidden / per_vec;
	int vpt = vpt_min;
	while (vpt > 1 && hv < (size_t)vpt * 32)
		vpt /= 2;
	while ((hv + (size_t)vpt - 1) / (size_t)vpt > 512)
		vpt *= 2;
	size_t t = (hv + (size_t)vpt - 1) / (size_t)vpt;
	s->vpt = vpt;
	s->threads = (int)round_up(t, 32);
	s->hvec = hv;
	return 0;
}

int dptp_ar_norm_default_flags(const struct dptp_ar_shape *s)
{
	int f = DPTP_NORM_FLAGS;
	if (s->threads != 512 || s->vpt != 2)
		f &= ~(DPTP_NORM_L2PF | DPTP_NORM_L2PF_LINES | DPTP_NORM_L2PF_LATE);
	return f;
}

void dptp_ar_slice(size_t tokens, int nranks, int s, size_t *begin, size_t *end)
{
	/* Balanced: sizes differ by at most one, the largest is ceil(tokens/n). */
	*begin = tokens * (size_t)s / (size_t)nranks;
	*end = tokens * (size_t)(s + 1) / (size_t)nranks;
}

int dptp_ar_grid(enum dptp_ar_algo algo, int nranks, size_t tokens, int max_blocks, int resident)
{
	size_t rows = tokens;
	if (algo == DPTP_AR_TWOSHOT)
		rows = (tokens + (size_t)nranks - 1) / (size_t)nranks;
	size_t g = rows;
	if (max_blocks > 0 && g > (size_t)max_blocks)
		g = (size_t)max_blocks;
	/* Blocks that wait for peers must all be resident; the norm kernel's
	 * blocks loop over the rows when asked to be only what fits;
	 * two-shot pairs blocks through DPTP_AR_MAX_BLOCKS flag slots. */
	if (resident > 0 && g > (size_t)resident)
		g = (size_t)resident;
	if (g > ((size_t)1 << 30))
		g = (size_t)1 << 30;
	if (algo == DPTP_AR_TWOSHOT && g > DPTP_AR_MAX_BLOCKS)
		g = DPTP_AR_MAX_BLOCKS;
	return g < 1 ? 1 : (int)g;
}
