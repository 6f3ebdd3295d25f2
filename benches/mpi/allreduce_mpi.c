/*
 * allreduce_mpi: MPI_Allreduce (float32, sum) timed the way nccl-tests'
 * all_reduce_perf times ncclAllReduce, with the same flags and the same
 * result table, so MPI libraries can be compared with rccl-rs'
 * all_reduce_perf row by row.
 *
 * Flow per run (mirrors nccl-tests' common.cu and rccl-tests' harness):
 *   - send and receive buffers of maxbytes each, 64-byte aligned, per rank;
 *   - warm-up: -w operations at every size from -b to -e, doubling;
 *   - per size, out-of-place then in-place (MPI_IN_PLACE):
 *       one untimed operation, MPI_Barrier, then -n timed operations
 *       (the buffers rotate through the maxbytes region, as nccl-tests
 *       does), time per operation averaged over the ranks (-a 1 default;
 *       -a 0 rank 0's, 2 min, 3 max);
 *     then, with -c 1, the buffers are filled with a rank- and
 *     index-dependent pattern of small integers (exact in float32 whatever
 *     the summation order), one more operation runs, and every output
 *     element is compared with the exact sum (#wrong, summed over ranks);
 *   - algbw = bytes / time, busbw = algbw * 2 (n - 1) / n;
 *   - footer: "# Avg bus bandwidth" = mean busbw over all columns.
 *
 * Build: mpicc -O2 -o allreduce_mpi allreduce_mpi.c
 * Run:   mpirun -np 2 ./allreduce_mpi -b 8 -e 256M -f 2 -n 20 -w 5
 */
#include <mpi.h>
#include <ctype.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static size_t parse_size(const char *text) {
    char *end;
    double v = strtod(text, &end);
    while (*end && isspace((unsigned char)*end)) end++;
    double unit = 1.0;
    switch (*end) {
    case 'G': case 'g': unit = 1024.0 * 1024.0 * 1024.0; break;
    case 'M': case 'm': unit = 1024.0 * 1024.0; break;
    case 'K': case 'k': unit = 1024.0; break;
    case '\0': break;
    default:
        fprintf(stderr, "invalid size '%s'\n", text);
        exit(2);
    }
    if (v < 0) { fprintf(stderr, "invalid size '%s'\n", text); exit(2); }
    return (size_t)(v * unit);
}

/* nccl-tests' getFloatStr: value in width columns, fewer decimals as the
 * integer part grows, then exponent form. */
static void float_str(char *out, size_t n, double value, int width) {
    int power = 0;
    for (uint64_t val = 1; value >= (double)val && power < 40; val *= 10) power++;
    if (power + 2 < width)
        snprintf(out, n, "%*.2f", width, value);
    else if (power + 1 < width)
        snprintf(out, n, "%*.1f", width, value);
    else if (power < width + 1)
        snprintf(out, n, "%*.0f", width, value);
    else if (width >= 7)
        snprintf(out, n, "%*.1e", width, value);
    else
        snprintf(out, n, "%*.0e", width, value);
}

/* The fill: small integers, so every partial sum is exact in float32. */
static inline float pattern(int rank, size_t j, int seed) {
    return (float)((int)((j * 7 + (size_t)rank * 13 + (size_t)seed * 3) % 29) - 14);
}

struct opts {
    size_t minbytes, maxbytes, stepbytes;
    long stepfactor;
    int iters, warmup, check, average;
};

static int rank, nranks;

static double reduce_time(double local, int average) {
    double out = local;
    switch (average) {
    case 0: MPI_Bcast(&out, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); break;
    case 2: MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); break;
    case 3: MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); break;
    default:
        MPI_Allreduce(&local, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        out /= nranks;
    }
    return out;
}

static void run_op(float *send, float *recv, size_t count, int in_place) {
    int rc;
    /* Counts above INT_MAX elements are not reachable with the sizes this
     * harness accepts (checked in main). */
    if (in_place)
        rc = MPI_Allreduce(MPI_IN_PLACE, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else
        rc = MPI_Allreduce(send, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        fprintf(stderr, "rank %d: MPI_Allreduce failed (%d)\n", rank, rc);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
}

int main(int argc, char **argv) {
    struct opts o = {8, 32 * 1024 * 1024, 1024 * 1024, 1, 20, 1, 1, 1};
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    static struct option longopts[] = {
        {"minbytes", required_argument, 0, 'b'},
        {"maxbytes", required_argument, 0, 'e'},
        {"stepbytes", required_argument, 0, 'i'},
        {"stepfactor", required_argument, 0, 'f'},
        {"iters", required_argument, 0, 'n'},
        {"warmup_iters", required_argument, 0, 'w'},
        {"check", required_argument, 0, 'c'},
        {"average", required_argument, 0, 'a'},
        {"datatype", required_argument, 0, 'd'},
        {"op", required_argument, 0, 'o'},
        {"nthreads", required_argument, 0, 't'},
        {"ngpus", required_argument, 0, 'g'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:a:d:o:t:g:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'b': o.minbytes = parse_size(optarg); break;
        case 'e': o.maxbytes = parse_size(optarg); break;
        case 'i': o.stepbytes = parse_size(optarg); o.stepfactor = 1; break;
        case 'f': o.stepfactor = strtol(optarg, NULL, 0); break;
        case 'n': o.iters = (int)strtol(optarg, NULL, 0); break;
        case 'w': o.warmup = (int)strtol(optarg, NULL, 0); break;
        case 'c': o.check = (int)strtol(optarg, NULL, 0); break;
        case 'a': o.average = (int)strtol(optarg, NULL, 0); break;
        case 'd':
            if (strcmp(optarg, "float") != 0 && strcmp(optarg, "float32") != 0) {
                if (rank == 0) fprintf(stderr, "only -d float is supported\n");
                MPI_Finalize();
                return 2;
            }
            break;
        case 'o':
            if (strcmp(optarg, "sum") != 0) {
                if (rank == 0) fprintf(stderr, "only -o sum is supported\n");
                MPI_Finalize();
                return 2;
            }
            break;
        case 't': case 'g':
            if (strtol(optarg, NULL, 0) != 1) {
                if (rank == 0) fprintf(stderr, "-t and -g must be 1 (one MPI process per rank)\n");
                MPI_Finalize();
                return 2;
            }
            break;
        default:
            if (rank == 0)
                fprintf(stderr,
                        "usage: %s [-b minbytes] [-e maxbytes] [-f stepfactor | -i stepbytes]\n"
                        "          [-n iters] [-w warmup_iters] [-c check] [-a average]\n"
                        "          [-d float] [-o sum]\n",
                        argv[0]);
            MPI_Finalize();
            return c == 'h' ? 0 : 2;
        }
    }
    if (o.minbytes > o.maxbytes || o.maxbytes / sizeof(float) > 0x7fffffff) {
        if (rank == 0) fprintf(stderr, "invalid sizes: %zu > %zu or too large\n", o.minbytes, o.maxbytes);
        MPI_Finalize();
        return 2;
    }
    if (o.iters < 1) o.iters = 1;

    int version, subversion, lib_len;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_version(&version, &subversion);
    MPI_Get_library_version(lib, &lib_len);
    for (char *p = lib; *p; p++)
        if (*p == '\n') { *p = '\0'; break; }
    if (rank == 0) {
        printf("# allreduce_mpi (MPI_Allreduce, host memory) MPI %d.%d: %s\n", version, subversion, lib);
        printf("# Collective test starting: allreduce_mpi\n");
        if (o.stepfactor > 1)
            printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %ld(factor) warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0 unalign: 0\n",
                   o.minbytes, o.maxbytes, o.stepfactor, o.warmup, o.iters, o.check);
        else
            printf("# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(bytes) warmup iters: %d iters: %d agg iters: 1 validation: %d graph: 0 unalign: 0\n",
                   o.minbytes, o.maxbytes, o.stepbytes, o.warmup, o.iters, o.check);
        printf("#\n# Using devices\n");
    }
    char host[256] = "localhost";
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    /* Rank 0 prints every rank's line: lines printed by each rank reach
     * the launcher's output in no fixed order, and could land inside the
     * results table. */
    int pid = (int)getpid();
    int *pids = rank == 0 ? malloc(sizeof(int) * (size_t)nranks) : NULL;
    char *hosts = rank == 0 ? malloc(sizeof host * (size_t)nranks) : NULL;
    if (rank == 0 && (!pids || !hosts)) {
        fprintf(stderr, "rank 0: out of memory for the device list\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Gather(&pid, 1, MPI_INT, pids, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Gather(host, sizeof host, MPI_CHAR, hosts, sizeof host, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        for (int r = 0; r < nranks; r++)
            printf("#  Rank %2d Group  0 Pid %6d on %10s device  0 [host] host memory\n", r, pids[r],
                   hosts + (size_t)r * sizeof host);
        fflush(stdout);
        free(pids);
        free(hosts);
    }

    size_t buf_bytes = o.maxbytes < 64 ? 64 : o.maxbytes;
    float *sendbuf = NULL, *recvbuf = NULL;
    if (posix_memalign((void **)&sendbuf, 64, buf_bytes) || posix_memalign((void **)&recvbuf, 64, buf_bytes)) {
        fprintf(stderr, "rank %d: out of memory for %zu-byte buffers\n", rank, buf_bytes);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    memset(sendbuf, 0, buf_bytes);
    memset(recvbuf, 0, buf_bytes);

    /* Warm-up at every size, doubling (as rccl-tests' harness does). */
    MPI_Barrier(MPI_COMM_WORLD);
    for (size_t size = o.minbytes; size <= o.maxbytes; size *= 2) {
        size_t count = size / sizeof(float);
        for (int i = 0; i < o.warmup; i++) run_op(sendbuf, recvbuf, count, 0);
        if (size == 0) break;
    }

    if (rank == 0) {
        printf("#\n");
        printf("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n", "", "", "", "", "");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "size", "count", "type", "redop", "root",
               "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
        printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s \n", "(B)", "(elements)", "", "", "", "(us)",
               "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    }

    double bw_sum = 0;
    int bw_count = 0;
    long errors = 0;
    int seed = 0;
    size_t size = o.minbytes;
    for (;;) {
        size_t count = size / sizeof(float);
        size_t total = count * sizeof(float);
        size_t steps = total ? o.maxbytes / total : 1;
        if (steps < 1) steps = 1;
        if (rank == 0)
            printf("%12zu  %12zu  %8s  %6s  %6d", total, count, "float", "sum", -1);
        for (int in_place = 0; in_place <= 1; in_place++) {
            run_op(sendbuf, recvbuf, count, in_place);
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int it = 0; it < o.iters; it++) {
                size_t shift = (size_t)(it % steps) * count;
                run_op(sendbuf + shift, recvbuf + shift, count, in_place);
            }
            double local = (MPI_Wtime() - t0) / o.iters;
            double delta = reduce_time(local, o.average);
            double algbw = delta > 0 ? (double)total / 1e9 / delta : 0;
            double busbw = algbw * 2.0 * (nranks - 1) / nranks;
            MPI_Barrier(MPI_COMM_WORLD);

            long wrong = 0;
            if (o.check > 0) {
                seed++;
                float *in = in_place ? recvbuf : sendbuf;
                for (size_t j = 0; j < count; j++) in[j] = pattern(rank, j, seed);
                if (!in_place) memset(recvbuf, 0, total);
                run_op(sendbuf, recvbuf, count, in_place);
                long local_wrong = 0;
                for (size_t j = 0; j < count; j++) {
                    float want = 0;
                    for (int r = 0; r < nranks; r++) want += pattern(r, j, seed);
                    if (recvbuf[j] != want) local_wrong++;
                }
                MPI_Allreduce(&local_wrong, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
                errors += wrong;
            }
            if (rank == 0) {
                char t[32], a[32], b[32];
                float_str(t, sizeof t, delta * 1e6, 7);
                float_str(a, sizeof a, algbw, 6);
                float_str(b, sizeof b, busbw, 6);
                if (o.check > 0)
                    printf("  %7s  %6s  %6s  %6ld", t, a, b, wrong);
                else
                    printf("  %7s  %6s  %6s    N/A", t, a, b);
            }
            bw_sum += busbw;
            bw_count++;
        }
        if (rank == 0) {
            printf("\n");
            fflush(stdout);
        }
        size_t next = o.stepfactor > 1 ? size * (size_t)o.stepfactor : size + o.stepbytes;
        if (next == size || next > o.maxbytes) break;
        size = next;
    }
    if (rank == 0) {
        printf("# %-20s : %ld %s\n", "Out of bounds values", errors, errors ? "FAILED" : "OK");
        printf("# %-20s : %g \n", "Avg bus bandwidth", bw_count ? bw_sum / bw_count : 0.0);
        printf("#\n# Collective test concluded: allreduce_mpi\n#\n\n");
        fflush(stdout);
    }
    free(sendbuf);
    free(recvbuf);
    MPI_Finalize();
    return errors ? 1 : 0;
}
