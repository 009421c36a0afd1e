/* A stand-in libnccl for test_audit_preload: the calls torch makes, each
 * returning ncclSuccess (0) and counting itself. */
#include <netinet/in.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

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
	/* as NCCL's RAS thread binds its port in every process: from inside
	 * libnccl, so the audit leaves it out of the program's names */
	const char *port = getenv("FAKE_NCCL_BIND_PORT");
	if (port) {
		int s = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(port)),
					.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		if (s >= 0) {
			(void)bind(s, (struct sockaddr *)&a, sizeof(a));
			close(s);
		}
	}
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
