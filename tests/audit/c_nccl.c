/* crec_e2e's nccl program. "vectors": prints sig_h and term of each
 * signature/place pair given (audit_rec.h's functions, checked against
 * /work/contract.md's test vectors). "calls": two communicators, then on
 * the first 10 all_reduce (4 floats), a send, 2 broadcast from root 1, and
 * 3 all_reduce on the second (8 floats); the C recorder's count records
 * past a small cap are checked by crec_e2e.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/audit_rec.h"
#include "c_nccl.h"

int main(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "vectors")) {
		for (int i = 2; i + 1 < argc; i += 2) {
			uint64_t h = dptp_audit_sig_hash(argv[i], strlen(argv[i]));
			printf("%016llx %016llx\n", (unsigned long long)h,
			       (unsigned long long)dptp_audit_term(h, strtoull(argv[i + 1], NULL, 10)));
		}
		return 0;
	}
	crec_id a = {{1}}, b = {{2}};
	void *c1, *c2;
	float x[8] = {0};
	int rc = ncclCommInitRank(&c1, 2, a, 0) | ncclCommInitRank(&c2, 2, b, 0);
	for (int i = 0; i < 10; i++)
		rc |= ncclAllReduce(x, x, 4, 7, 0, c1, NULL);
	rc |= ncclSend(x, 4, 7, 1, c1, NULL);
	for (int i = 0; i < 2; i++)
		rc |= ncclBroadcast(x, x, 4, 7, 1, c1, NULL);
	for (int i = 0; i < 3; i++)
		rc |= ncclAllReduce(x, x, 8, 7, 0, c2, NULL);
	return rc ? 1 : 0;
}
