/* libFuzzer: the c10d rendezvous state decoder (launcher/rdzv/rdzv_state.c), the
 * bytes anyone who reaches the store port can write under
 * /torch.rendezvous.<id>. A state it accepts must encode, and the encoding
 * must decode to the same state and encode to the same bytes again. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rdzv/rdzv_state.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static bool same_nodes(const struct rdzv_nd *a, const struct rdzv_nd *b, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (!rdzv_state_nd_eq(&a[i], &b[i]))
			return false;
	return true;
}

static bool same(const struct rdzv_state *a, const struct rdzv_state *b)
{
	return a->round == b->round && a->complete == b->complete && a->closed == b->closed &&
	       a->has_deadline == b->has_deadline && a->deadline_us == b->deadline_us && a->npart == b->npart &&
	       a->nwait == b->nwait && a->nredund == b->nredund && a->nheart == b->nheart &&
	       same_nodes(a->part, b->part, a->npart) && !memcmp(a->rank, b->rank, a->npart * sizeof(a->rank[0])) &&
	       same_nodes(a->wait, b->wait, a->nwait) && same_nodes(a->redund, b->redund, a->nredund) &&
	       same_nodes(a->heart, b->heart, a->nheart) &&
	       !memcmp(a->heart_us, b->heart_us, a->nheart * sizeof(a->heart_us[0]));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct rdzv_state s1, s2;
	struct dptp_err err = {0};
	uint8_t *e1 = NULL, *e2 = NULL;
	size_t n1 = 0, n2 = 0;
	int rc = rdzv_state_decode(data, size, &s1, &err);
	if (rc != 0) {
		if (rc != -EPROTO && rc != -E2BIG && rc != -ENOMEM)
			__builtin_trap();
		if (!err.msg[0])
			__builtin_trap(); /* a refusal always says why */
		return 0;
	}
	/* datetimes outside what the encoder writes (years 1..9999) are not
	 * produced by the decoder: it refuses them */
	if (rdzv_state_encode(&s1, &e1, &n1, &err) != 0)
		__builtin_trap();
	if (rdzv_state_decode(e1, n1, &s2, &err) != 0 || !same(&s1, &s2))
		__builtin_trap();
	if (rdzv_state_encode(&s2, &e2, &n2, &err) != 0 || n1 != n2 || memcmp(e1, e2, n1))
		__builtin_trap();
	free(e1);
	free(e2);
	return 0;
}
