/* A stand-in libnccl for test_audit_preload: the calls torch makes, each
 * returning ncclSuccess (0) and counting itself. */
#include <stddef.h>

typedef struct {
	char internal[128];
} fake_id;

int fake_nccl_calls;

int ncclCommInitRank(void **comm, int nranks, fake_id id, int rank);
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st);

int ncclCommInitRank(void **comm, int nranks, fake_id id, int rank)
{
	static int the_comm;
	(void)nranks;
	(void)id;
	(void)rank;
	*comm = &the_comm;
	fake_nccl_calls++;
	return 0;
}

int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st)
{
	(void)s, (void)r, (void)n, (void)dt, (void)op, (void)c, (void)st;
	fake_nccl_calls++;
	return 0;
}
