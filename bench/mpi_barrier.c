/* MPI_Barrier latency for bench/mpi_barrier.py: argv[1] timed barriers
 * after 100 untimed ones; rank 0 prints "barrier_us <mean microseconds>". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
	int rank, iters = argc > 1 ? atoi(argv[1]) : 1000;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	for (int i = 0; i < 100; i++)
		MPI_Barrier(MPI_COMM_WORLD);
	double t0 = MPI_Wtime();
	for (int i = 0; i < iters; i++)
		MPI_Barrier(MPI_COMM_WORLD);
	double us = (MPI_Wtime() - t0) * 1e6 / (iters > 0 ? iters : 1);
	if (rank == 0)
		printf("barrier_us %.2f\n", us);
	MPI_Finalize();
	return 0;
}
