/* The CUDA device of each rank. Every function exists in every build;
 * without CUDA they return -ENOTSUP with a message (collective ones still
 * take their exchange round), so callers need no #if. */
#ifndef DPTP_LIB_PLANE_DEVICE_H
#define DPTP_LIB_PLANE_DEVICE_H

#include <stdbool.h>
#include <stddef.h>

#include "plane/group.h"

/* Number of visible CUDA devices, 0 without CUDA or a driver. */
int dptp_cuda_visible_devices(void);

/* Makes ordinal current and describes it: "GPU-uuid (pci 0000:19:00.0)". */
int dptp_cuda_use_device(int ordinal, char *id, size_t n, struct dptp_err *err);
/* The identity of an ordinal without switching to it. */
int dptp_cuda_device_id(int ordinal, char *id, size_t n, struct dptp_err *err);

/* Collective over world. Picks this rank's device from its LOCAL_RANK (an
 * index into the visible devices; DPTP_GPU_SHARING=1 lets several local
 * ranks share one, for single-GPU testing), makes it current, and records
 * every rank's in peers[].device; *shared tells whether two ranks of a host
 * share one. */
int dptp_device_choose(struct dptp_exchange *x, const struct dptp_group *world, struct dptp_peer *peers,
		       int rank, int *ordinal, bool *shared, struct dptp_err *err);

/* NCCL's own verdict on a communicator over g on the current device.
 * Collective (one exchange round). */
int dptp_cuda_nccl_probe(struct dptp_exchange *x, const struct dptp_group *g, struct dptp_err *err);

/* -ENOTSUP, "this dptp was built without CUDA ...". */
int dptp_no_cuda(struct dptp_err *err);

#endif
