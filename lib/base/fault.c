#include "base/fault.h"

#include <errno.h>
#include <string.h>

const struct dptp_fault_desc dptp_faults[DPTP_NFAULTS] = {
	[DPTP_FAULT_BCAST_GLOBAL_SRC] = {
		.name = "bcast-global-src", .check = "broadcast", .bug = 2,
		.mech = "R", .bugs = "flashinfer's torch backend (BUGS.md bug 2); as DeepSpeed PR 2999, torchrec PR 4601",
		.summary = "the exchange backend broadcasts with src = the group-local root, read as a global rank",
		.symptom = "torch: \"Global rank 0 is not part of group\"; vLLM left the workspace empty and the fused kernel hung",
		.where = "lib/plane/group.c dptp_xchg_root_src()",
	},
	[DPTP_FAULT_OPID_SEEDED] = {
		.name = "opid-seeded", .check = "opid", .bug = 4,
		.mech = "I", .bugs = "flashinfer PR 3102, vLLM 36674",
		.summary = "TP roots draw the IPC opId from an RNG seeded with --seed in every process",
		.symptom = "[Errno 98] Address already in use on /tmp/mcastmem-socket-*, or descriptors delivered to the wrong group",
		.where = "lib/ipc/workspace.c opid_draw()",
	},
	[DPTP_FAULT_DEVICE_TP_RANK] = {
		.name = "device-tp-rank", .check = "device-map", .bug = 3,
		.mech = "D", .bugs = "flashinfer (BUGS.md bug 3); as SGLang PR 7584, vLLM issue 17176",
		.summary = "the workspace device (and current device) is taken from tp_rank instead of LOCAL_RANK",
		.symptom = "NCCL \"Duplicate GPU detected\" or CUBLAS_STATUS_EXECUTION_FAILED in DP replica 1",
		.where = "lib/ipc/workspace.c dptp_workspace_device()",
	},
	[DPTP_FAULT_WORLD_WORKSPACE] = {
		.name = "world-workspace", .check = "fused-allreduce", .bug = 1,
		.mech = "G", .bugs = "vLLM PR 45917",
		.summary = "the fused-allreduce workspace is exchanged on the WORLD group with rank=tp_rank, size=tp_size",
		.symptom = "IPC/NCCL errors at start-up with DP+TP (EADDRINUSE, descriptors crossing DP replicas); dp=1 healthy",
		.where = "lib/checks/fused_allreduce.c fused_setup()",
	},
	[DPTP_FAULT_DISPATCH_EP_GROUP] = {
		.name = "dispatch-ep-group", .check = "dispatch", .bug = 5,
		.mech = "G", .bugs = "vLLM NaiveAll2AllManager (BUGS.md bug 5)",
		.summary = "naive MoE dispatch broadcasts slice idx from EP-group root idx instead of DP-group root idx",
		.symptom = "DP replica 0's MoE output correct, replica 1's garbage",
		.where = "lib/checks/dispatch.c dispatch_run()",
	},
	[DPTP_FAULT_DP_RANK_RESET] = {
		.name = "dp-rank-reset", .check = "resources", .bug = 0,
		.mech = "C", .bugs = "vLLM issue 56949, SGLang PR 29211, SGLang issue 4149",
		.summary = "after start-up every replica believes it is DP rank 0 and derives its port, shared-memory name and payload from it",
		.symptom = "zmq.error.ZMQError: Address already in use (addr='tcp://...'), or every replica serving replica 0's data",
		.where = "lib/checks/resources.c resources_dp_rank()",
	},
	[DPTP_FAULT_SHM_NAME_NO_GROUP] = {
		.name = "shm-name-no-group", .check = "resources", .bug = 0,
		.mech = "I", .bugs = "vLLM PR 18536, TensorRT-LLM PR 7377",
		.summary = "the shared-memory segment name is built from the group-local rank alone (no group, no DP rank)",
		.symptom = "FileExistsError: [Errno 17] File exists: '/...'; shared-memory set-up fails",
		.where = "lib/checks/resources.c resources_shm_name()",
	},
	[DPTP_FAULT_SUBGROUP_REDUCE] = {
		.name = "subgroup-reduce", .check = "reduce-span", .bug = 0,
		.mech = "G", .bugs = "SGLang PR 32963 (also 32511, 32012)",
		.summary = "the TP all-reduce runs over a strict subgroup of the TP group (the EP subgroup of moe_tp x moe_ep), missing the orthogonal part of the sum",
		.symptom = "silent garbage: GSM8K 0.012; TP8/EP2 0/8",
		.where = "lib/checks/reduce_span.c reduce_span_tp_group()",
	},
	[DPTP_FAULT_WORLD_REDUCE] = {
		.name = "world-reduce", .check = "reduce-span", .bug = 0,
		.mech = "G", .bugs = "Megatron-LM issue 7452, transformers PR 48383",
		.summary = "the TP all-reduce falls back to the WORLD group (no group given)",
		.symptom = "silent: replicas mixed; or a deadlock where two TP models share the default group",
		.where = "lib/checks/reduce_span.c reduce_span_tp_group()",
	},
	[DPTP_FAULT_ROOT_BY_LOCAL_RANK] = {
		.name = "root-by-local-rank", .check = "broadcast", .bug = 0,
		.mech = "R", .bugs = "tokenspeed PR 786, PyTorch issue 130515 (also 74602, 149200)",
		.summary = "the exchange backend's \"am I the root?\" test compares the group-local rank with the global src (the mirror image of bug 2)",
		.symptom = "DP replica 1's requests dropped or stalled, replica 0 fine; silent: all gradients zero in subgroups",
		.where = "lib/plane/group.c dptp_xchg_is_root()",
	},
	[DPTP_FAULT_IDLE_SKIP] = {
		.name = "idle-skip", .check = "lockstep", .bug = 0,
		.mech = "P", .bugs = "vLLM issue 43547, SGLang issue 28915",
		.summary = "a replica with zero tokens returns before the DP-wide collectives its peers enter",
		.symptom = "a permanent hang (reduce_scatter deadlock after about an hour) with DP; dp=1 healthy",
		.where = "lib/checks/lockstep.c serve_step()",
	},
	[DPTP_FAULT_LOCAL_SHAPE] = {
		.name = "local-shape", .check = "lockstep", .bug = 0,
		.mech = "P", .bugs = "vLLM PR 25906",
		.summary = "the DP-wide collective is sized from the replica's own unpadded token count, not the DP-synced maximum",
		.symptom = "DP/EP hang: members of the DP group disagree on the size of one collective",
		.where = "lib/checks/lockstep.c dispatch_count()",
	},
};

int dptp_fault_lookup(const char *name)
{
	for (int i = 0; i < DPTP_NFAULTS; i++)
		if (strcmp(dptp_faults[i].name, name) == 0)
			return i;
	return -1;
}

int dptp_fault_parse(const char *list, dptp_fault_set *out, struct dptp_err *err)
{
	dptp_fault_set set = 0;
	if (!list)
		list = "";
	if (strcmp(list, "all") == 0) {
		*out = (1u << DPTP_NFAULTS) - 1;
		return 0;
	}
	if (strcmp(list, "none") == 0 || !*list) {
		*out = 0;
		return 0;
	}
	const char *p = list;
	for (;;) {
		const char *comma = strchr(p, ',');
		size_t n = comma ? (size_t)(comma - p) : strlen(p);
		char name[64];
		if (n == 0 || n >= sizeof(name))
			return dptp_err_set(err, -EINVAL, "invalid fault list '%s' (empty or over-long name)", list);
		memcpy(name, p, n);
		name[n] = 0;
		int id = dptp_fault_lookup(name);
		if (id < 0)
			return dptp_err_set(err, -EINVAL, "unknown fault '%s' (see --list)", name);
		if (set & (1u << id))
			return dptp_err_set(err, -EINVAL, "fault '%s' given twice", name);
		set |= 1u << id;
		if (!comma)
			break;
		p = comma + 1;
	}
	*out = set;
	return 0;
}
