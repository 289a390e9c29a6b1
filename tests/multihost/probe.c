/* Multi-host test probe (tests/multihost/test_multihost_tcp.sh): each rank reports the network namespace it runs
 * in; rank 0 then times a 2 MiB message (plus a 1-byte reply) to every other rank, after one untimed warm-up, so
 * that the test can check where each rank ran and that the throttled link is slow.
 * Prints lines "ns RANK INODE HOSTNAME" and "send RANK SECONDS". */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#define CHECK(call)                                                              \
  do {                                                                           \
    int rc_ = (call);                                                            \
    if (rc_ != MPI_SUCCESS) {                                                    \
      fprintf(stderr, "probe: %s failed (%d) at %s:%d\n", #call, rc_, __FILE__, __LINE__); \
      MPI_Abort(MPI_COMM_WORLD, 2);                                              \
    }                                                                            \
  } while (0)

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, size;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  struct stat st;
  unsigned long long ino = stat("/proc/self/ns/net", &st) == 0 ? (unsigned long long)st.st_ino : 0ULL;
  unsigned long long* all = malloc(sizeof(unsigned long long) * (size_t)size);
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  char* names = calloc((size_t)size, MPI_MAX_PROCESSOR_NAME);
  int len = 0;
  CHECK(MPI_Get_processor_name(name, &len));
  CHECK(MPI_Gather(&ino, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD));
  CHECK(MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0,
                   MPI_COMM_WORLD));
  if (rank == 0)
    for (int r = 0; r < size; ++r) printf("ns %d %llu %s\n", r, all[r], names + (size_t)r * MPI_MAX_PROCESSOR_NAME);

  const int n = 2 << 20;
  char* buf = calloc((size_t)n, 1);
  char ack = 0;
  for (int r = 1; r < size; ++r) {
    CHECK(MPI_Barrier(MPI_COMM_WORLD));
    /* The first round trip opens the TCP connection (and empties the token bucket); the second one is timed. */
    for (int round = 0; round < 2; ++round) {
      if (rank == 0) {
        double t0 = MPI_Wtime();
        CHECK(MPI_Send(buf, n, MPI_CHAR, r, 1, MPI_COMM_WORLD));
        CHECK(MPI_Recv(&ack, 1, MPI_CHAR, r, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        if (round == 1) printf("send %d %.6f\n", r, MPI_Wtime() - t0);
      } else if (rank == r) {
        CHECK(MPI_Recv(buf, n, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE));
        CHECK(MPI_Send(&ack, 1, MPI_CHAR, 0, 2, MPI_COMM_WORLD));
      }
    }
  }
  fflush(stdout);
  free(buf);
  free(all);
  free(names);
  MPI_Finalize();
  return 0;
}
