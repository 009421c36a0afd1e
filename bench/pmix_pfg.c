/* One PMIx client of bench/pmix.py: ROUNDS rounds of Put (one 64-byte
 * global key), Commit, a collecting Fence over the job, then a Get of
 * every rank's key. Rank 0 prints the phase totals in seconds:
 *   pfg ranks N rounds R put P fence F get G total T
 * (its own view; every rank does the same work). */
#include <pmix.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
	pmix_proc_t me, wild, p;
	pmix_value_t *v = NULL, val;
	pmix_info_t info;
	bool collect = true;
	int rounds = argc > 1 ? atoi(argv[1]) : 20;
	double tput = 0, tfence = 0, tget = 0, t0, t1;
	uint32_t size;
	char key[32], data[64];

	if (PMIx_Init(&me, NULL, 0) != PMIX_SUCCESS)
		return 1;
	PMIX_LOAD_PROCID(&wild, me.nspace, PMIX_RANK_WILDCARD);
	if (PMIx_Get(&wild, PMIX_JOB_SIZE, NULL, 0, &v) != PMIX_SUCCESS)
		return 1;
	size = v->data.uint32;
	PMIX_VALUE_RELEASE(v);
	PMIX_INFO_LOAD(&info, PMIX_COLLECT_DATA, &collect, PMIX_BOOL);
	PMIx_Fence(&wild, 1, NULL, 0); /* everyone is up */
	t0 = now();
	for (int r = 0; r < rounds; r++) {
		double a = now(), b, c;
		snprintf(key, sizeof(key), "pfg.%d", r);
		memset(data, 'a' + (int)((me.rank + (unsigned)r) % 26), sizeof(data) - 1);
		data[sizeof(data) - 1] = '\0';
		PMIX_VALUE_LOAD(&val, data, PMIX_STRING);
		if (PMIx_Put(PMIX_GLOBAL, key, &val) != PMIX_SUCCESS || PMIx_Commit() != PMIX_SUCCESS)
			return 2;
		PMIX_VALUE_DESTRUCT(&val);
		b = now();
		if (PMIx_Fence(&wild, 1, &info, 1) != PMIX_SUCCESS)
			return 3;
		c = now();
		for (uint32_t k = 0; k < size; k++) {
			PMIX_LOAD_PROCID(&p, me.nspace, k);
			if (PMIx_Get(&p, key, NULL, 0, &v) != PMIX_SUCCESS || v->type != PMIX_STRING ||
			    v->data.string[0] != 'a' + (int)((k + (unsigned)r) % 26))
				return 4;
			PMIX_VALUE_RELEASE(v);
		}
		tput += b - a;
		tfence += c - b;
		tget += now() - c;
	}
	t1 = now();
	PMIx_Fence(&wild, 1, NULL, 0);
	if (me.rank == 0)
		printf("pfg ranks %u rounds %d put %.4f fence %.4f get %.4f total %.4f\n", size, rounds, tput, tfence, tget,
			t1 - t0);
	PMIX_INFO_DESTRUCT(&info);
	PMIx_Finalize(NULL, 0);
	return 0;
}
