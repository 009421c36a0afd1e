/* --numa-binding: the CPUs each worker is bound to, chosen as torchrun 2.11
 * chooses them (torch/numa/binding.py): the worker with local rank i uses
 * CUDA device i (the launcher's CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER
 * apply, as in torch's agent), the device's PCI address gives its NUMA node
 * (/sys/bus/pci/devices/<addr>/numa_node, -1 read as 0), and the mode picks
 * CPUs of that node, always within the launcher's own affinity:
 *   node          every CPU of the node
 *   socket        every CPU of every node on the node's socket
 *   exclusive     the node's physical cores split evenly among the node's
 *                 GPUs (the lower GPUs get one more when it does not divide)
 *   core-complex  one group of CPUs sharing the last-level cache, a different
 *                 one per GPU of the node where there are enough
 * Only the CPU affinity is set (torch runs numactl --physcpubind); the memory
 * policy stays the default, local allocation, i.e. the bound CPUs' node.
 *
 * The CUDA devices come from libcuda.so.1, loaded at run time only when the
 * option is given. Test hooks: DPTP_RUN_TEST_SYSFS replaces /sys,
 * DPTP_RUN_TEST_GPU_BUS_IDS (comma-separated PCI addresses, in CUDA order)
 * replaces the CUDA query. */
#ifndef DPTP_LAUNCHER_NUMA_H
#define DPTP_LAUNCHER_NUMA_H

#include <stddef.h>
#include <stdint.h>

#include "base/util.h"

enum { NUMA_MAX_CPUS = 4096 };

struct numa_mask {
	uint64_t bits[NUMA_MAX_CPUS / 64];
};

struct numa_plan {
	unsigned n;
	struct numa_mask *masks; /* one per local rank */
};

/* mode: node, socket, exclusive or core-complex. Returns 0, or a negative
 * errno with err naming the local rank, the device and what is missing. */
int numa_plan_build(struct numa_plan *p, const char *mode, unsigned nlocal, struct dptp_err *err);
/* The same from a given sysfs root, launcher affinity and GPU list (PCI
 * addresses in CUDA order; NULL: ask CUDA). */
int numa_plan_build_at(struct numa_plan *p, const char *mode, unsigned nlocal, const char *root,
	const struct numa_mask *allowed, const char *gpus, struct dptp_err *err);
void numa_plan_release(struct numa_plan *p);

/* "0-3,8,10-11" (the kernel's cpulist form); -EINVAL on anything else. */
int numa_mask_parse(const char *s, struct numa_mask *m);
/* The same form back; buf is always terminated. */
void numa_mask_format(const struct numa_mask *m, char *buf, size_t len);

#endif
