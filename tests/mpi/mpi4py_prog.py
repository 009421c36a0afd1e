"""mpi4py under a launcher (run with Debian's /usr/bin/python3): the same
lines as mpi_prog.c's hello and allreduce modes."""
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
top = comm.allreduce(rank, op=MPI.MAX)
if total != size * (size + 1) // 2 or top != size - 1:
    print("rank %d: allreduce result is wrong" % rank, file=sys.stderr)
    comm.Abort(3)
gathered = comm.allgather(rank)
print("mpi4py rank %d/%d sum %d max %d gather %s" % (rank, size, total, top, gathered), flush=True)
