/* MPI programs for tests/mpi/mpi_e2e.py, one per mode (argv[1]):
 *   hello      "hello R/N" from every rank
 *   ring       a token passed once around all ranks, each adds its rank
 *   allreduce  MPI_Allreduce of rank+1 (sum) and of rank (max)
 *   split      MPI_Comm_split into two halves, MPI_Bcast in each half
 *   abort      rank N-1 calls MPI_Abort(7) while the others wait
 *   nofinalize rank N-1 returns 0 without MPI_Finalize, the others wait
 *              in MPI_Barrier (an abnormal end for the launcher)
 *   spawn      MPI_Comm_spawn under the default error handler: the
 *              launcher refuses it and ends the job
 *   spawn_return  the same under MPI_ERRORS_RETURN (Open MPI's other
 *              ranks wait in MPI_Comm_spawn for the root, which has left:
 *              only the launcher's end of the job ends them)
 *   wait       "waiting R" after a barrier, then a receive that no rank
 *              answers: the job only ends when the launcher ends it
 *   alltoall   MPI_Alltoall of rank*100+peer, checked
 *   io         MPI-IO: each rank writes its rank at offset rank*4 of
 *              argv[2] (collective), rank 0 reads all back
 * Every line on stdout is deterministic per rank, so the runs under
 * dptp-run and under mpirun compare line for line after sorting. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static int fail(const char *what)
{
	fprintf(stderr, "rank %d: %s\n", rank, what);
	MPI_Abort(MPI_COMM_WORLD, 3);
	return 3;
}

/* "shm PATH" for every file under /dev/shm this process maps (Open MPI's
 * shared-memory segments), so that the test knows which files must be gone
 * after an abnormal end */
static void print_shm(void)
{
	char line[4096], last[4096] = "";
	FILE *f = fopen("/proc/self/maps", "r");
	while (f && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, " /dev/shm/");
		if (!p)
			continue;
		p[strcspn(p, "\n")] = '\0';
		if (strcmp(p + 1, last)) {
			printf("shm %s\n", p + 1);
			snprintf(last, sizeof(last), "%s", p + 1);
		}
	}
	if (f)
		fclose(f);
}

static int ring(void)
{
	int token = 0, next = (rank + 1) % size, prev = (rank + size - 1) % size;
	if (size == 1) {
		printf("ring rank 0 token 0\n");
		return 0;
	}
	if (rank == 0) {
		MPI_Send(&token, 1, MPI_INT, next, 0, MPI_COMM_WORLD);
		MPI_Recv(&token, 1, MPI_INT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		if (token != size * (size - 1) / 2)
			return fail("ring token is wrong");
	} else {
		MPI_Recv(&token, 1, MPI_INT, prev, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
		token += rank;
		MPI_Send(&token, 1, MPI_INT, next, 0, MPI_COMM_WORLD);
	}
	printf("ring rank %d token %d\n", rank, token);
	return 0;
}

static int allreduce(void)
{
	int one = rank + 1, sum = 0, max = -1;
	MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	MPI_Allreduce(&rank, &max, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (sum != size * (size + 1) / 2 || max != size - 1)
		return fail("allreduce result is wrong");
	printf("allreduce rank %d sum %d max %d\n", rank, sum, max);
	return 0;
}

static int split(void)
{
	MPI_Comm half;
	int color = rank < size / 2, hrank, hsize, val;
	MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
	MPI_Comm_rank(half, &hrank);
	MPI_Comm_size(half, &hsize);
	/* each half's root sends its world rank times 10 */
	val = hrank == 0 ? rank * 10 + 1 : -1;
	MPI_Bcast(&val, 1, MPI_INT, 0, half);
	if (val != (color ? 0 : size / 2) * 10 + 1)
		return fail("bcast value is wrong");
	printf("split rank %d half %d hrank %d/%d value %d\n", rank, color, hrank, hsize, val);
	MPI_Comm_free(&half);
	return 0;
}

static int spawn(void)
{
	MPI_Comm child;
	int errs[1];
	char *argv[] = {NULL};
	MPI_Comm_spawn("/bin/true", argv, 1, MPI_INFO_NULL, 0, MPI_COMM_WORLD, &child, errs);
	printf("spawn rank %d succeeded\n", rank);
	return 0;
}

static int alltoall(void)
{
	int *out = malloc(size * sizeof(int)), *in = malloc(size * sizeof(int)), ok = 1;
	for (int i = 0; i < size; i++)
		out[i] = rank * 100 + i;
	MPI_Alltoall(out, 1, MPI_INT, in, 1, MPI_INT, MPI_COMM_WORLD);
	for (int i = 0; i < size; i++)
		ok &= in[i] == i * 100 + rank;
	free(out);
	free(in);
	if (!ok)
		return fail("alltoall result is wrong");
	printf("alltoall rank %d ok\n", rank);
	return 0;
}

static int io(const char *path)
{
	MPI_File f;
	int v = rank * 7 + 1, sum = 0;
	if (!path)
		return fail("io needs a file name");
	MPI_File_open(MPI_COMM_WORLD, path, MPI_MODE_CREATE | MPI_MODE_RDWR, MPI_INFO_NULL, &f);
	MPI_File_write_at_all(f, (MPI_Offset)rank * (MPI_Offset)sizeof(int), &v, 1, MPI_INT, MPI_STATUS_IGNORE);
	MPI_File_sync(f);
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == 0) {
		for (int i = 0; i < size; i++) {
			int r = -1;
			MPI_File_read_at(f, (MPI_Offset)i * (MPI_Offset)sizeof(int), &r, 1, MPI_INT, MPI_STATUS_IGNORE);
			if (r != i * 7 + 1)
				return fail("io read back a wrong value");
			sum += r;
		}
	}
	MPI_File_close(&f);
	printf("io rank %d wrote %d%s\n", rank, v, rank == 0 ? (sum ? " read all" : "") : "");
	return 0;
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "hello";
	int rc = 0;
	setvbuf(stdout, NULL, _IOLBF, 0);
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (!strcmp(mode, "hello")) {
		printf("hello %d/%d\n", rank, size);
	} else if (!strcmp(mode, "ring")) {
		rc = ring();
	} else if (!strcmp(mode, "allreduce")) {
		rc = allreduce();
	} else if (!strcmp(mode, "split")) {
		rc = split();
	} else if (!strcmp(mode, "abort")) {
		MPI_Barrier(MPI_COMM_WORLD);
		print_shm();
		if (rank == size - 1)
			MPI_Abort(MPI_COMM_WORLD, 7);
		MPI_Barrier(MPI_COMM_WORLD);
	} else if (!strcmp(mode, "nofinalize")) {
		MPI_Barrier(MPI_COMM_WORLD);
		print_shm();
		if (rank == size - 1)
			return 0;
		MPI_Barrier(MPI_COMM_WORLD);
	} else if (!strcmp(mode, "alltoall")) {
		rc = alltoall();
	} else if (!strcmp(mode, "io")) {
		rc = io(argc > 2 ? argv[2] : NULL);
	} else if (!strcmp(mode, "wait")) {
		int x;
		MPI_Barrier(MPI_COMM_WORLD);
		print_shm();
		printf("waiting %d\n", rank);
		MPI_Recv(&x, 1, MPI_INT, MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
	} else if (!strcmp(mode, "spawn") || !strcmp(mode, "spawn_return")) {
		if (!strcmp(mode, "spawn_return"))
			MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
		MPI_Barrier(MPI_COMM_WORLD);
		print_shm();
		rc = spawn();
	} else {
		fprintf(stderr, "mpi_prog: unknown mode '%s'\n", mode);
		rc = 2;
	}
	MPI_Finalize();
	return rc;
}
