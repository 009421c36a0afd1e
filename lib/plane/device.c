/* The CUDA device of each rank: visible devices, identities, the choice
 * from LOCAL_RANK, NCCL's own verdict on a set of devices. */
#include "plane/device.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dptp-config.h"

#if DPTP_HAVE_CUDA

#include "kernels.h"
#include "plane/comm_nccl.h"

int dptp_cuda_visible_devices(void)
{
	int n = 0;
	return dptp_cuda_device_count(&n, NULL) == 0 ? n : 0;
}

int dptp_cuda_device_id(int ordinal, char *id, size_t n, struct dptp_err *err)
{
	char uuid[64] = "", pci[64] = "";
	DPTP_TRY(dptp_cuda_device_uuid(ordinal, uuid, sizeof(uuid), err));
	DPTP_TRY(dptp_cuda_device_pci_bus_id(ordinal, pci, sizeof(pci), err));
	snprintf(id, n, "%s (pci %s)", uuid, pci);
	return 0;
}

int dptp_cuda_use_device(int ordinal, char *id, size_t n, struct dptp_err *err)
{
	DPTP_TRY(dptp_cuda_set_device(ordinal, err));
	return id ? dptp_cuda_device_id(ordinal, id, n, err) : 0;
}

int dptp_cuda_nccl_probe(struct dptp_exchange *x, const struct dptp_group *g, struct dptp_err *err)
{
#if DPTP_HAVE_NCCL
	return dptp_nccl_probe(g->size, g->index, x, g, err);
#else
	dptp_xchg_barrier(x, g, NULL); /* lockstep */
	return dptp_err_set(err, -ENOTSUP, "built without NCCL");
#endif
}

int dptp_device_choose(struct dptp_exchange *x, const struct dptp_group *world, struct dptp_peer *peers,
		       int rank, int *ordinal, bool *shared, struct dptp_err *err)
{
	int count = 0;
	int rc = dptp_cuda_device_count(&count, err);
	int lr = peers[rank].local_rank;
	const char *sh = getenv("DPTP_GPU_SHARING");
	bool sharing = sh && strcmp(sh, "1") == 0;
	int32_t ord = -1;
	if (rc == 0 && count == 0)
		rc = dptp_err_set(err, -ENODEV, "no CUDA device is visible");
	else if (rc == 0 && lr >= count && !sharing)
		rc = dptp_err_set(err, -ENODEV,
			"LOCAL_RANK %d has no GPU: %d visible (CUDA_VISIBLE_DEVICES=%s); "
			"run one rank per GPU, or set DPTP_GPU_SHARING=1 to share GPUs (testing only)",
			lr, count, getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
	if (rc == 0) {
		ord = sharing ? lr % count : lr;
		rc = dptp_cuda_set_device(ord, err);
	}
	/* everyone learns everyone's device, and whether any GPU is shared */
	int32_t *ords = calloc((size_t)world->size, sizeof(int32_t));
	if (!ords)
		return dptp_err_set(err, -ENOMEM, "out of memory");
	struct dptp_err e2 = {0};
	int arc = dptp_xchg_allgather(x, world, &ord, sizeof(ord), ords, &e2);
	bool failed = false;
	*shared = false;
	for (int r = 0; arc == 0 && r < world->size; r++) {
		peers[r].device = ords[r];
		failed |= ords[r] < 0;
		for (int q = 0; q < r; q++)
			*shared |= peers[q].host == peers[r].host && ords[q] == ords[r];
	}
	free(ords);
	if (rc < 0)
		return rc;
	if (arc < 0) {
		if (err)
			*err = e2;
		return arc;
	}
	if (failed)
		return dptp_err_set(err, -ENODEV, "another rank has no usable GPU");
	*ordinal = ord;
	return 0;
}

#else /* no CUDA in this build */

int dptp_cuda_visible_devices(void) { return 0; }
int dptp_cuda_use_device(int ordinal, char *id, size_t n, struct dptp_err *err) { return dptp_no_cuda(err); }
int dptp_cuda_device_id(int ordinal, char *id, size_t n, struct dptp_err *err) { return dptp_no_cuda(err); }
int dptp_cuda_nccl_probe(struct dptp_exchange *x, const struct dptp_group *g, struct dptp_err *err)
{
	dptp_xchg_barrier(x, g, NULL); /* lockstep */
	return dptp_no_cuda(err);
}
int dptp_device_choose(struct dptp_exchange *x, const struct dptp_group *world, struct dptp_peer *peers,
		       int rank, int *ordinal, bool *shared, struct dptp_err *err)
{
	return dptp_no_cuda(err);
}

#endif

int dptp_no_cuda(struct dptp_err *err)
{
	return dptp_err_set(err, -ENOTSUP, "this dptp was built without CUDA (the cuda feature is off)");
}
