/* libFuzzer: the layout (lib/base/layout.c, world/dp/pp/tp from the input) and
 * the fault-list parser (lib/base/fault.c, the rest of the input as a string).
 * Invariants: a layout is accepted iff dp*pp*tp == world (0 = derive), and
 * then rank <-> coordinate round-trips and every group lists its member at
 * my_index; a fault list parses to a set of known faults or is refused with
 * a one-line message. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/fault.h"
#include "base/layout.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int32_t rd32(const uint8_t **p, size_t *n)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++) {
		v = v << 8 | (*n ? **p : 0);
		if (*n) {
			(*p)++;
			(*n)--;
		}
	}
	/* mostly small numbers (interesting layouts), sometimes anything */
	return (v & 0x80000000u) ? (int32_t)v : (int32_t)(v % 70);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *p = data;
	size_t n = size;
	int world = rd32(&p, &n), dp = rd32(&p, &n), pp = rd32(&p, &n), tp = rd32(&p, &n);
	struct dptp_layout l;
	struct dptp_err err = {0};
	int r = dptp_layout_init(&l, world, dp, pp, tp, &err);
	if (r != 0 && r != -EINVAL)
		__builtin_trap();
	if (r < 0 && (!err.msg[0] || strchr(err.msg, '\n')))
		__builtin_trap();
	if (r == 0) {
		if (l.world < 1 || l.world > DPTP_MAX_WORLD || l.dp * l.pp * l.tp != l.world)
			__builtin_trap();
		if ((dp && l.dp != dp) || (pp && l.pp != pp) || (tp && l.tp != tp))
			__builtin_trap();
		int *ranks = malloc(sizeof(int) * (size_t)l.world);
		int step = l.world / 16 + 1;
		for (int rank = 0; rank < l.world; rank += step) {
			struct dptp_coord c = dptp_layout_coord(&l, rank);
			if (dptp_layout_rank(&l, c) != rank)
				__builtin_trap();
			for (int k = DPTP_GROUP_TP; k <= DPTP_GROUP_WORLD; k++) {
				int idx = -1;
				int gs = dptp_layout_group(&l, (enum dptp_group_kind)k, rank, ranks, &idx);
				if (gs < 1 || gs > l.world || idx < 0 || idx >= gs || ranks[idx] != rank)
					__builtin_trap();
				for (int i = 0; i < gs; i++)
					if (ranks[i] < 0 || ranks[i] >= l.world)
						__builtin_trap();
				if (!dptp_group_kind_name((enum dptp_group_kind)k))
					__builtin_trap();
			}
		}
		for (int k = DPTP_GROUP_TP; k <= DPTP_GROUP_WORLD; k++) {
			int ng = dptp_layout_ngroups(&l, (enum dptp_group_kind)k);
			if (ng < 1 || ng > l.world)
				__builtin_trap();
			int total = 0;
			for (int i = 0; i < ng; i++)
				total += dptp_layout_group_at(&l, (enum dptp_group_kind)k, i, ranks);
			if (k != DPTP_GROUP_WORLD && k != DPTP_GROUP_EP && total != l.world)
				__builtin_trap(); /* TP, PP and DP groups partition the world */
		}
		free(ranks);
	}

	char *list = malloc(n + 1);
	memcpy(list, p, n);
	list[n] = 0;
	dptp_fault_set set = 0;
	struct dptp_err ferr = {0};
	r = dptp_fault_parse(list, &set, &ferr);
	if (r != 0 && r != -EINVAL)
		__builtin_trap();
	if (r == 0 && (set >> DPTP_NFAULTS))
		__builtin_trap();
	if (r < 0 && (!ferr.msg[0] ||
		      (strchr(ferr.msg, '\n') && (!memchr(p, '\n', n) || getenv("FUZZ_STRICT_MESSAGES")))))
		__builtin_trap();
	if (r == 0 && memchr(p, 0, n) == NULL) {
		for (int i = 0; i < DPTP_NFAULTS; i++)
			if (dptp_fault_on(set, (enum dptp_fault_id)i) &&
			    dptp_fault_lookup(dptp_faults[i].name) != i)
				__builtin_trap();
	}
	(void)dptp_fault_lookup(list);
	free(list);
	return 0;
}
