/* mpi_bench: OpenMPI anchor for bench/compare.sh (MPI_Allreduce, MPI_Bcast, MPI_Allgather,
 * MPI_Alltoall on float buffers), with ditto-bench's sizes and nccl-tests' time / algbw / busbw.
 *
 *   mpicc -O2 -o mpi_bench bench/mpi_bench.c
 *   mpirun --allow-run-as-root --oversubscribe -np 4 ./mpi_bench MIN_BYTES MAX_BYTES FACTOR \
 *          SECONDS MAX_ITERS CSV_FILE [OPS]
 *
 * OPS: a comma list of all_reduce, broadcast, all_gather, all_to_all (default the first three).
 * all_to_all's size is each rank's whole send buffer (nccl-tests' alltoall), busbw factor
 * (n-1)/n.
 *
 * Each size: one checked call (#wrong counts elements that differ from the expected result), one
 * warm-up call that sets the iteration count (rank 0's estimate, broadcast), then the timed calls
 * back to back between two barriers. Sizes as nccl-tests: all_gather's size is the gathered
 * buffer. Rank 0 appends rows to CSV_FILE (header when the file is new). */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_alloc(void* p) {
  if (!p) {
    fprintf(stderr, "mpi_bench: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (argc != 7 && argc != 8) {
    if (rank == 0)
      fprintf(stderr,
              "usage: mpi_bench MIN_BYTES MAX_BYTES FACTOR SECONDS MAX_ITERS CSV_FILE [OPS]\n");
    MPI_Finalize();
    return 2;
  }
  const long long min_b = atoll(argv[1]), max_b = atoll(argv[2]);
  const long long factor = atoll(argv[3]);
  const double seconds = atof(argv[4]);
  const int max_iters = atoi(argv[5]);
  if (min_b <= 0 || max_b < min_b || factor < 2 || max_iters < 1) {
    if (rank == 0) fprintf(stderr, "mpi_bench: bad arguments\n");
    MPI_Finalize();
    return 2;
  }
  FILE* csv = NULL;
  if (rank == 0) {
    FILE* probe = fopen(argv[6], "r");
    int fresh = 1;
    if (probe) {
      fresh = fgetc(probe) == EOF;
      fclose(probe);
    }
    csv = fopen(argv[6], "a");
    if (!csv) {
      fprintf(stderr, "mpi_bench: cannot open %s\n", argv[6]);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (fresh)
      fprintf(csv, "backend,op,ranks,place,determinism,bytes,count,iters,time_us,algbw_GBps,"
                   "busbw_GBps,mem_GBps,wrong\n");
  }
  const char* ops[4] = {"all_reduce", "broadcast", "all_gather", "all_to_all"};
  const char* wanted = argc == 8 ? argv[7] : "all_reduce,broadcast,all_gather";
  for (int o = 0; o < 4; ++o) {
    /* o runs when its name is an entry of the comma list `wanted` */
    const size_t len = strlen(ops[o]);
    int run = 0;
    for (const char* p = wanted; *p;) {
      const char* end = strchr(p, ',');
      const size_t l = end ? (size_t)(end - p) : strlen(p);
      if (l == len && strncmp(p, ops[o], len) == 0) run = 1;
      p += l + (end ? 1 : 0);
    }
    if (!run) continue;
    for (long long bytes = min_b; bytes <= max_b; bytes *= factor) {
      long long total = bytes / 4;
      if (o >= 2) total = total / n * n;
      if (total == 0) continue;
      /* elements per rank-block (all_gather: the send; all_to_all: one destination's block) */
      const long long count = o >= 2 ? total / n : total;
      const long long send_n = o == 3 ? total : count;
      float* send = malloc((size_t)send_n * sizeof(float));
      float* recv = malloc((size_t)total * sizeof(float));
      check_alloc(send);
      check_alloc(recv);
      for (long long i = 0; i < send_n; ++i) send[i] = (float)(rank + 1 + i % 13);
      long long wrong = 0;
#define CALL()                                                                                \
  do {                                                                                        \
    if (o == 0) MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);    \
    else if (o == 1) MPI_Bcast(send, (int)count, MPI_FLOAT, 0, MPI_COMM_WORLD);               \
    else if (o == 2)                                                                          \
      MPI_Allgather(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD); \
    else MPI_Alltoall(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD); \
  } while (0)
      CALL();
      for (long long i = 0; i < (o >= 2 ? total : count); ++i) {
        float want = 0;
        if (o == 0)
          for (int q = 0; q < n; ++q) want += (float)(q + 1 + i % 13);
        else if (o == 1)
          want = (float)(1 + i % 13);
        else if (o == 2)
          want = (float)(i / count + 1 + (i % count) % 13);
        else /* block q of recv: block `rank` of rank q's send */
          want = (float)(i / count + 1 + (rank * count + i % count) % 13);
        float got = o == 1 ? send[i] : recv[i];
        if (got != want) ++wrong;
      }
      long long wrong_all = 0;
      MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      CALL();
      MPI_Barrier(MPI_COMM_WORLD);
      double one = MPI_Wtime() - t0;
      MPI_Bcast(&one, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
      int iters = (int)(seconds / (one > 1e-7 ? one : 1e-7));
      if (iters < 1) iters = 1;
      if (iters > max_iters) iters = max_iters;
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
      for (int it = 0; it < iters; ++it) CALL();
      MPI_Barrier(MPI_COMM_WORLD);
      const double t = (MPI_Wtime() - t0) / iters;
      if (rank == 0) {
        const double algbw = (double)bytes / t / 1e9;
        const double bus = o == 0 ? 2.0 * (n - 1) / n : (o == 1 ? 1.0 : (double)(n - 1) / n);
        /* CSV `count`: elements of the size (nccl-tests' count column) */
        fprintf(csv, "mpi,%s,%d,%s,-,%lld,%lld,%d,%.3f,%.4f,%.4f,,%lld\n", ops[o], n,
                o == 1 ? "in" : "out", bytes, total, iters, t * 1e6, algbw, algbw * bus, wrong_all);
        fflush(csv);
        printf("  mpi  %-10s ranks=%d %11lld B %11.1f us busbw %7.2f GB/s wrong %lld\n", ops[o], n,
               bytes, t * 1e6, algbw * bus, wrong_all);
        fflush(stdout);
      }
      free(send);
      free(recv);
    }
  }
  if (csv) fclose(csv);
  MPI_Finalize();
  return 0;
}
