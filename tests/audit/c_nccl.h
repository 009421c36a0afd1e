/* The NCCL calls of crec_e2e's nccl program (c_nccl.c) and of its stand-in
 * libnccl (c_nccl_lib.c). */
#ifndef DPTP_TESTS_AUDIT_C_NCCL_H
#define DPTP_TESTS_AUDIT_C_NCCL_H

#include <stddef.h>

typedef struct {
	char internal[128];
} crec_id;

int ncclCommInitRank(void **comm, int nranks, crec_id id, int rank);
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st);
int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, void *c, void *st);
int ncclSend(const void *s, size_t n, int dt, int peer, void *c, void *st);

#endif
