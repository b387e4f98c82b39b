/* An MPI program for softnic/tests/mpi_stock.rs: rank 0 sends messages of 1 byte to
 * 1 MiB (powers of 16), 20 of each, to rank 1, which adds 1 to every byte and sends
 * them back; rank 0 checks every byte. Then an MPI_Allreduce of the ranks' numbers.
 * Prints "ok sum=S size=N" on rank 0; exits through MPI_Abort (status 2) on a wrong
 * byte. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned char expect(int i, int it, int len)
{
	return (unsigned char)(i * 7 + it + len);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	int rank, size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	const int max = 1 << 20;
	unsigned char *buf = malloc(max);
	if (!buf)
		MPI_Abort(MPI_COMM_WORLD, 2);
	for (int len = 1; len <= max; len *= 16) {
		for (int it = 0; it < 20; it++) {
			if (rank == 0) {
				for (int i = 0; i < len; i++)
					buf[i] = expect(i, it, len);
				MPI_Send(buf, len, MPI_BYTE, 1, it, MPI_COMM_WORLD);
				MPI_Recv(buf, len, MPI_BYTE, 1, it, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				for (int i = 0; i < len; i++)
					if (buf[i] != (unsigned char)(expect(i, it, len) + 1)) {
						printf("BAD len %d byte %d\n", len, i);
						fflush(stdout);
						MPI_Abort(MPI_COMM_WORLD, 2);
					}
			} else if (rank == 1) {
				MPI_Recv(buf, len, MPI_BYTE, 0, it, MPI_COMM_WORLD,
					 MPI_STATUS_IGNORE);
				for (int i = 0; i < len; i++)
					buf[i]++;
				MPI_Send(buf, len, MPI_BYTE, 0, it, MPI_COMM_WORLD);
			}
		}
	}
	long mine = rank + 1, sum = 0;
	MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	if (rank == 0)
		printf("ok sum=%ld size=%d\n", sum, size);
	free(buf);
	MPI_Finalize();
	return 0;
}
