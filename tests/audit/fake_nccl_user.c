/* Plays libtorch_cuda for test_audit_preload: linked to the fake libnccl,
 * loaded by the test with RTLD_LOCAL, as torch loads its libraries. */
#include <stddef.h>

typedef struct {
	char internal[128];
} fake_id;

int ncclCommInitRank(void **comm, int nranks, fake_id id, int rank);
int ncclAllReduce(const void *s, void *r, size_t n, int dt, int op, void *c, void *st);
int fake_user_run(void);

int fake_user_run(void)
{
	void *comm = NULL;
	fake_id id = {{1, 2, 3}};
	int rc = ncclCommInitRank(&comm, 1, id, 0);
	if (rc)
		return rc;
	return ncclAllReduce(NULL, NULL, 16, 7, 0, comm, NULL);
}
