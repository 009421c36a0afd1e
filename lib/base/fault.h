/* The named fault injections. Each one changes exactly the decision the real
 * bug got wrong (which group, which index, which seed, which device) at the
 * place the real code made it; nothing here touches a verdict.
 *
 * Where each fault acts -- the one function that makes its decision (the
 * context, lib/checks/ctx.c, only hands the flag to the instance it builds):
 *
 *   fault               bug  acts in
 *   bcast-global-src     2   lib/plane/group.c        dptp_xchg_root_src()
 *                            (flag: dptp_exchange.root_as_global)
 *   opid-seeded          4   lib/ipc/workspace.c      opid_draw(), in dptp_opid_agree()
 *                            (flag: dptp_ipc_job.opid_seeded)
 *   device-tp-rank       3   lib/ipc/workspace.c      dptp_workspace_device()
 *                            (flag: dptp_ipc_job.device_from_tp_rank)
 *   world-workspace      1   lib/checks/fused_allreduce.c  fused_setup()
 *   dispatch-ep-group    5   lib/checks/dispatch.c    dispatch_run()
 *   dp-rank-reset        C   lib/checks/resources.c   resources_dp_rank()
 *   shm-name-no-group    I   lib/checks/resources.c   resources_shm_name()
 *   subgroup-reduce      G   lib/checks/reduce_span.c reduce_span_tp_group()
 *   world-reduce         G   lib/checks/reduce_span.c reduce_span_tp_group()
 *   root-by-local-rank   R   lib/plane/group.c        dptp_xchg_is_root()
 *                            (flag: dptp_exchange.root_by_local_rank)
 *   idle-skip            P   lib/checks/lockstep.c    serve_step()
 *   local-shape          P   lib/checks/lockstep.c    dispatch_count()
 *
 * The same text is each row's `where` below (tests/test_fault.c checks that
 * the function it names exists in that file). */
#ifndef DPTP_LIB_FAULT_H
#define DPTP_LIB_FAULT_H

#include <stdbool.h>
#include <stdint.h>

#include "base/util.h"

enum dptp_fault_id {
	DPTP_FAULT_BCAST_GLOBAL_SRC,
	DPTP_FAULT_OPID_SEEDED,
	DPTP_FAULT_DEVICE_TP_RANK,
	DPTP_FAULT_WORLD_WORKSPACE,
	DPTP_FAULT_DISPATCH_EP_GROUP,
	DPTP_FAULT_DP_RANK_RESET,
	DPTP_FAULT_SHM_NAME_NO_GROUP,
	DPTP_FAULT_SUBGROUP_REDUCE,
	DPTP_FAULT_WORLD_REDUCE,
	DPTP_FAULT_ROOT_BY_LOCAL_RANK,
	DPTP_FAULT_IDLE_SKIP,
	DPTP_FAULT_LOCAL_SHAPE,
	DPTP_NFAULTS,
};

struct dptp_fault_desc {
	const char *name;    /* CLI spelling */
	const char *check;   /* the check that catches it */
	int bug;             /* number in reference/BUGS.md, 0 for the wider family */
	const char *mech;    /* mechanism code(s) of reference/FAMILY.md: "G", "C,I", ... */
	const char *bugs;    /* the public bugs it stands for, as FAMILY.md names them */
	const char *summary; /* what the code does wrong */
	const char *symptom; /* what the real bug looked like */
	const char *where;   /* "file function()": the one place it acts */
};

extern const struct dptp_fault_desc dptp_faults[DPTP_NFAULTS];

/* A set of faults, one bit per enum dptp_fault_id. */
typedef uint32_t dptp_fault_set;
/* every fault has its bit, and "all" ((1u << DPTP_NFAULTS) - 1) does not
 * overflow: a 32nd fault needs a wider dptp_fault_set */
_Static_assert(DPTP_NFAULTS < 32, "dptp_fault_set has a bit for fewer than 32 faults");

static inline bool dptp_fault_on(dptp_fault_set s, enum dptp_fault_id f)
{
	return (s >> f) & 1u;
}

/* Name -> id, or -1. */
int dptp_fault_lookup(const char *name);

/* Parses "a,b,c" or "all" (or "none"/"") into *out. An unknown or repeated
 * name is refused with a message naming it. Returns 0 or -EINVAL. */
int dptp_fault_parse(const char *list, dptp_fault_set *out, struct dptp_err *err);

#endif
