/* crec_e2e's stand-in libnccl (built as libnccl-crec.so): a communicator
 * and the calls c_nccl.c makes, each returning ncclSuccess (0). */
#include "c_nccl.h"

static int comms[4], ncomms;

int ncclCommInitRank(void **comm, int nranks, crec_id id, int rank)
{
	(void)nranks, (void)id, (void)rank;
	*comm = &comms[ncomms++ % 4];
	return 0;
}

int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st)
{
	(void)s, (void)r, (void)n, (void)dt, (void)op, (void)c, (void)st;
	return 0;
}

int ncclBroadcast(const void *s, void *r, size_t n, int dt, int root, void *c, void *st)
{
	(void)s, (void)r, (void)n, (void)dt, (void)root, (void)c, (void)st;
	return 0;
}

int ncclSend(const void *s, size_t n, int dt, int peer, void *c, void *st)
{
	(void)s, (void)n, (void)dt, (void)peer, (void)c, (void)st;
	return 0;
}
