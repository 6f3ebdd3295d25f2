#!/usr/bin/env bash
# All-reduce (float32 sum, host memory, one host) of rccl-rs against MPI.
#
# Builds rccl-tests' all_reduce_perf and benches/mpi/allreduce_mpi.c (an
# nccl-tests-style harness for MPI_Allreduce), then, in one run:
#   - rccl-rs all_reduce_perf, one process per rank (torchrun variables,
#     127.0.0.1, a free port), 2 and 4 processes;
#   - OpenMPI MPI_Allreduce, mpirun -np 2 and -np 4, default settings and
#     with the tuned component forced to the ring algorithm
#     (--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4);
#   - MPICH MPI_Allreduce, default settings, if MPICH is installed
#     (COMPARE_MPICH=0 skips it); only with no more processes than CPUs
#     unless MPICH_OVERSUBSCRIBE=1: Debian's MPICH polls without yielding,
#     and 4 processes on 2 cores took 20-40 ms per 8-byte operation, so
#     its sweeps would not finish in the time limit;
#   - Intel MPI MPI_Allreduce, default settings over its shared-memory
#     fabric (I_MPI_FABRICS=shm), 2 and 4 processes (COMPARE_IMPI=0 skips
#     it): the runtime and headers of PyPI's impi-rt and impi-devel
#     ($IMPI_VERSION), fetched with pip download and unpacked into the
#     ignored target/impi/ when missing; when it cannot be had or does not
#     run, the report says why;
#   - the 8-byte latency on its own, runs of LAT_ITERS iterations:
#     rccl-rs, OpenMPI (both settings), MPICH and Intel MPI (as above), LAT_SAMPLES
#     runs each per round, interleaved (one of each, then again), and
#     rccl-rs with NCCL_PROTO=LL, LL128 and Simple with the board off
#     (RCCL_BOARD_BYTES=0: the protocols shape FIFO traffic only; the
#     board, which carries the smallest all-reduces by default, has none);
# and prints a markdown table (also written to target/compare-mpi.md; the
# raw outputs go to target/compare-mpi/).
#
# Sizes 8 B .. 256 MiB, factor 2, in three sweeps with different iteration
# counts (small sizes need many iterations for a stable average, large
# ones few): 8 B..64 KiB, 128 KiB..4 MiB, 8 MiB..256 MiB.
#
# Everything runs ROUNDS times (3), the rounds one after another so that
# every library is measured in each; each figure reported is the fastest
# round (the lowest time) of its library and size. This VM runs a process
# in one of two speed modes about 2x apart, often for a whole sweep, so a
# single round compares one library's slow spell with another's fast one.
# The 8-byte latency, where both libraries take about a quarter of a
# microsecond and a spell moves either by 1.5x, is sampled LAT_SAMPLES
# times per round and reported as the fastest and the median sample.
#
# Installs openmpi-bin/libopenmpi-dev (and mpich/libmpich-dev) with apt-get
# when missing. Takes about 5-10 minutes on 2 cores. Run it on an idle
# machine: the load average is recorded at the start and the end.
#
# Environment knobs: ROUNDS, SMALL_ITERS, MID_ITERS, LARGE_ITERS, LAT_ITERS, LAT_SAMPLES, MAXBYTES,
# COMPARE_MPICH (1/0), MPICH_OVERSUBSCRIBE (1/0), COMPARE_IMPI (1/0), IMPI_VERSION, RUN_TIMEOUT (seconds per run), REPORT_ONLY=1 (only
# rebuild the report from the raw outputs of the last run).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT_DIR="$ROOT/target/compare-mpi"
REPORT="$ROOT/target/compare-mpi.md"
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
ROUNDS=${ROUNDS:-3}
SMALL_ITERS=${SMALL_ITERS:-1000}
LAT_ITERS=${LAT_ITERS:-100000}
LAT_SAMPLES=${LAT_SAMPLES:-5}
MID_ITERS=${MID_ITERS:-100}
LARGE_ITERS=${LARGE_ITERS:-10}
MAXBYTES=${MAXBYTES:-256M}
COMPARE_MPICH=${COMPARE_MPICH:-1}
MPICH_OVERSUBSCRIBE=${MPICH_OVERSUBSCRIBE:-0}
COMPARE_IMPI=${COMPARE_IMPI:-1}
IMPI_VERSION=${IMPI_VERSION:-2021.19.0}
IMPI_DIR="$ROOT/target/impi"
# Why Intel MPI has no column, when it has none.
IMPI_REASON=""
[ "$COMPARE_IMPI" = 1 ] || IMPI_REASON="skipped (COMPARE_IMPI=0)"
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
REPORT_ONLY=${REPORT_ONLY:-0}

log() { echo "== $*" >&2; }

# mpich_runs NPROCS: whether MPICH is compared at this process count.
mpich_runs() {
    [ "$COMPARE_MPICH" = 1 ] && { [ "$1" -le "$(nproc)" ] || [ "$MPICH_OVERSUBSCRIBE" = 1 ]; }
}

if [ "$REPORT_ONLY" != 1 ]; then
# ---------------------------------------------------------------- packages
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
apt_install() {
    log "installing $*"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@" >&2
}
if ! command -v mpicc.openmpi >/dev/null || ! command -v mpirun.openmpi >/dev/null; then
    apt_install openmpi-bin libopenmpi-dev
fi
if [ "$COMPARE_MPICH" = 1 ] && ! command -v mpicc.mpich >/dev/null; then
    # Debian's MPICH and OpenMPI coexist (update-alternatives picks the
    # unsuffixed names; this script only uses the suffixed ones).
    apt_install mpich libmpich-dev || { log "MPICH not installable; skipping it"; COMPARE_MPICH=0; }
fi
if [ "$COMPARE_MPICH" = 1 ] && ! command -v mpirun.mpich >/dev/null; then
    COMPARE_MPICH=0
fi
# impi_fetch: Intel MPI's runtime and headers unpacked into
# $IMPI_DIR/prefix (bin, lib, include: the wheels' data folders merged).
impi_fetch() {
    [ -r "$IMPI_DIR/prefix/lib/libmpi.so.12" ] && [ -r "$IMPI_DIR/prefix/include/mpi.h" ] && return 0
    command -v python3 >/dev/null || { IMPI_REASON="python3 (for pip) not found"; return 1; }
    log "fetching Intel MPI $IMPI_VERSION (impi-rt, impi-devel) into $IMPI_DIR"
    rm -rf "$IMPI_DIR/wheels" "$IMPI_DIR/unpacked" "$IMPI_DIR/prefix"
    if ! python3 -m pip download --no-deps -q -d "$IMPI_DIR/wheels" \
        "impi-rt==$IMPI_VERSION" "impi-devel==$IMPI_VERSION" >&2; then
        IMPI_REASON="pip download of impi-rt/impi-devel $IMPI_VERSION failed"
        return 1
    fi
    local w
    for w in "$IMPI_DIR"/wheels/*.whl; do
        python3 -m zipfile -e "$w" "$IMPI_DIR/unpacked" || { IMPI_REASON="unpacking $w failed"; return 1; }
    done
    mkdir -p "$IMPI_DIR/prefix"
    for w in "$IMPI_DIR"/unpacked/*.data/data; do cp -a "$w/." "$IMPI_DIR/prefix/"; done
    chmod +x "$IMPI_DIR"/prefix/bin/*
    rm -rf "$IMPI_DIR/wheels" "$IMPI_DIR/unpacked"
    [ -r "$IMPI_DIR/prefix/lib/libmpi.so.12" ] || { IMPI_REASON="the wheels hold no lib/libmpi.so.12"; return 1; }
}
if [ "$COMPARE_IMPI" = 1 ] && ! impi_fetch; then
    log "Intel MPI not measured: $IMPI_REASON"
    COMPARE_IMPI=0
fi
if ! command -v cargo >/dev/null; then
    echo "cargo not found" >&2
    exit 1
fi

# ------------------------------------------------------------------- build
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/*.txt
log "building all_reduce_perf"
cargo build --release --bin all_reduce_perf >&2
OURS="$TARGET_DIR/release/all_reduce_perf"
log "building allreduce_mpi"
mpicc.openmpi -O2 -Wall -o "$OUT_DIR/allreduce_openmpi" benches/mpi/allreduce_mpi.c
if [ "$COMPARE_MPICH" = 1 ]; then
    mpicc.mpich -O2 -Wall -o "$OUT_DIR/allreduce_mpich" benches/mpi/allreduce_mpi.c
fi
IMPI_RUN=(env I_MPI_ROOT="$IMPI_DIR/prefix" I_MPI_FABRICS=shm "$IMPI_DIR/prefix/bin/mpiexec.hydra")
if [ "$COMPARE_IMPI" = 1 ]; then
    # Compiled directly, not through Intel's mpicc wrapper, which expects
    # its install tree; the rpath finds the runtime without LD_LIBRARY_PATH.
    if ! cc -O2 -Wall -I"$IMPI_DIR/prefix/include" -o "$OUT_DIR/allreduce_impi" benches/mpi/allreduce_mpi.c \
        -L"$IMPI_DIR/prefix/lib" -lmpi -Wl,-rpath,"$IMPI_DIR/prefix/lib" >&2; then
        IMPI_REASON="building allreduce_mpi.c against its mpi.h failed"
    elif ! smoke=$(timeout 60 "${IMPI_RUN[@]}" -n 2 "$OUT_DIR/allreduce_impi" -b 8 -e 8 -n 10 -w 1 2>&1) ||
        ! grep -q '^ *8 ' <<<"$smoke"; then
        IMPI_REASON="mpiexec.hydra -n 2 did not run it: $(tail -1 <<<"$smoke")"
    fi
    if [ -n "$IMPI_REASON" ]; then
        log "Intel MPI not measured: $IMPI_REASON"
        COMPARE_IMPI=0
    fi
fi

# OpenMPI refuses to run as root without these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OMPI_RING=(--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4)

free_port() {
    local p
    for _ in $(seq 100); do
        p=$((20000 + RANDOM % 40000))
        # Nothing listening there: connecting fails.
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
            echo "$p"
            return
        fi
    done
    echo "no free port found" >&2
    exit 1
}

# ours NPROCS LOGFILE [VAR=VALUE ...] -- perf args...
ours() {
    local n=$1 logf=$2
    shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    local port pids=() rc=0
    port=$(free_port)
    for ((r = 0; r < n; r++)); do
        local dest=/dev/null
        [ "$r" -eq 0 ] && dest=$logf
        # Bound to a core each when they fit, as mpirun binds OpenMPI's
        # ranks (and as all_reduce_perf --procs does).
        local bind=()
        [ "$n" -le "$(nproc)" ] && bind=(taskset -c "$r")
        env "${envs[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n \
            MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
            timeout "$RUN_TIMEOUT" "${bind[@]}" "$OURS" -g 1 -t 1 "$@" >"$dest" 2>&1 &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || rc=$?; done
    [ "$rc" -eq 0 ] || log "rccl-rs run exited $rc (see $logf)"
}

# ompi NPROCS LOGFILE [mpirun options ...] -- harness args...
ompi() {
    local n=$1 logf=$2
    shift 2
    local opts=()
    while [ "$1" != "--" ]; do opts+=("$1"); shift; done
    shift
    # 4 processes on 2 cores need --oversubscribe to start at all.
    local over=()
    [ "$n" -gt "$(nproc)" ] && over=(--oversubscribe)
    timeout "$RUN_TIMEOUT" mpirun.openmpi -np "$n" "${over[@]}" "${opts[@]}" \
        "$OUT_DIR/allreduce_openmpi" "$@" >"$logf" 2>&1 || log "OpenMPI run exited $? (see $logf)"
}

mpich() {
    local n=$1 logf=$2
    shift 2
    timeout "$RUN_TIMEOUT" mpirun.mpich -np "$n" "$OUT_DIR/allreduce_mpich" "$@" >"$logf" 2>&1 \
        || log "MPICH run exited $? (see $logf)"
}

impi() {
    local n=$1 logf=$2
    shift 2
    timeout "$RUN_TIMEOUT" "${IMPI_RUN[@]}" -n "$n" "$OUT_DIR/allreduce_impi" "$@" >"$logf" 2>&1 \
        || log "Intel MPI run exited $? (see $logf)"
}

SWEEPS=(
    "small:-b 8 -e 64K -f 2 -n $SMALL_ITERS -w 50"
    "mid:-b 128K -e 4M -f 2 -n $MID_ITERS -w 5"
    "large:-b 8M -e $MAXBYTES -f 2 -n $LARGE_ITERS -w 2"
)

LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
START=$(date +%s)
log "load average at start: $LOAD_START"

rm -rf "$OUT_DIR"/r[0-9]*
for ((round = 1; round <= ROUNDS; round++)); do
    RUN="$OUT_DIR/r$round"
    mkdir -p "$RUN"
    log "round $round of $ROUNDS"
    for np in 2 4; do
        for sweep in "${SWEEPS[@]}"; do
            name=${sweep%%:*}
            read -r -a a <<<"${sweep#*:}"
            log "np=$np $name: rccl-rs"
            ours "$np" "$RUN/ours-$np-$name.txt" -- "${a[@]}"
            log "np=$np $name: OpenMPI default"
            ompi "$np" "$RUN/ompi-$np-$name.txt" -- "${a[@]}"
            log "np=$np $name: OpenMPI ring"
            ompi "$np" "$RUN/ompiring-$np-$name.txt" "${OMPI_RING[@]}" -- "${a[@]}"
            if mpich_runs "$np"; then
                log "np=$np $name: MPICH default"
                mpich "$np" "$RUN/mpich-$np-$name.txt" "${a[@]}"
            fi
            if [ "$COMPARE_IMPI" = 1 ]; then
                log "np=$np $name: Intel MPI default"
                impi "$np" "$RUN/impi-$np-$name.txt" "${a[@]}"
            fi
        done
        lat=(-b 8 -e 8 -n "$LAT_ITERS" -w 1000)
        log "np=$np 8 B latency: rccl-rs and the MPIs, $LAT_SAMPLES samples each, interleaved"
        rm -f "$RUN"/*-"$np"-lat.txt
        for ((sample = 1; sample <= LAT_SAMPLES; sample++)); do
            # Each sample is a run of its own; its rows are appended to the
            # library's file, whose fastest row the report takes.
            ours "$np" "$RUN/sample.txt" -- "${lat[@]}"
            cat "$RUN/sample.txt" >>"$RUN/ours-$np-lat.txt"
            ompi "$np" "$RUN/sample.txt" -- "${lat[@]}"
            cat "$RUN/sample.txt" >>"$RUN/ompi-$np-lat.txt"
            ompi "$np" "$RUN/sample.txt" "${OMPI_RING[@]}" -- "${lat[@]}"
            cat "$RUN/sample.txt" >>"$RUN/ompiring-$np-lat.txt"
            if mpich_runs "$np"; then
                mpich "$np" "$RUN/sample.txt" "${lat[@]}"
                cat "$RUN/sample.txt" >>"$RUN/mpich-$np-lat.txt"
            fi
            if [ "$COMPARE_IMPI" = 1 ]; then
                impi "$np" "$RUN/sample.txt" "${lat[@]}"
                cat "$RUN/sample.txt" >>"$RUN/impi-$np-lat.txt"
            fi
        done
        rm -f "$RUN/sample.txt"
        for proto in LL LL128 Simple; do
            log "np=$np 8 B: rccl-rs NCCL_PROTO=$proto, board off"
            ours "$np" "$RUN/ours-$np-proto-$proto.txt" NCCL_PROTO=$proto RCCL_BOARD_BYTES=0 -- \
                "${lat[@]}"
        done
    done
done

LOAD_END=$(cut -d' ' -f1-3 /proc/loadavg)
ELAPSED=$(($(date +%s) - START))
log "load average at end: $LOAD_END ($ELAPSED s of runs)"
printf 'LOAD_START=%q\nLOAD_END=%q\nELAPSED=%q\nCOMPARE_MPICH=%q\nMPICH_OVERSUBSCRIBE=%q\nCOMPARE_IMPI=%q\nIMPI_REASON=%q\nROUNDS=%q\nLAT_ITERS=%q\nLAT_SAMPLES=%q\n' \
    "$LOAD_START" "$LOAD_END" "$ELAPSED" "$COMPARE_MPICH" "$MPICH_OVERSUBSCRIBE" "$COMPARE_IMPI" "$IMPI_REASON" "$ROUNDS" "$LAT_ITERS" "$LAT_SAMPLES" >"$OUT_DIR/meta.env"

else
    # shellcheck disable=SC1091
    . "$OUT_DIR/meta.env"
fi

# ---------------------------------------------------------------- report
# column_at SIZE COLUMN NAMES...: every value of a result column (6 =
# out-of-place time) for SIZE bytes in every round's files of these names,
# one per line.
column_at() {
    local size=$1 col=$2 name files=()
    shift 2
    for name in "$@"; do
        for f in "$OUT_DIR"/r*/"$name"; do [ -r "$f" ] && files+=("$f"); done
    done
    [ "${#files[@]}" -gt 0 ] || return 0
    awk -v s="$size" -v c="$col" '$1 !~ /^#/ && NF >= 13 && $1 == s { print $c }' "${files[@]}"
}
# field SIZE COLUMN NAMES...: the lowest of those values (the fastest round
# or sample), "-" when there is none.
field() {
    column_at "$@" | sort -g | awk 'NR == 1 { v = $1 } END { print (NR ? v : "-") }'
}
# median_at SIZE COLUMN NAMES...: their median (every sample), "-" when
# there is none.
median_at() {
    column_at "$@" | sort -g |
        awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
existing() { # the arguments that are readable files
    local f
    for f in "$@"; do [ -r "$f" ] && echo "$f"; done
    return 0
}
wrong_total() {
    local files
    mapfile -t files < <(existing "$@")
    [ "${#files[@]}" -gt 0 ] || { echo "no results"; return 0; }
    awk '$1 !~ /^#/ && NF >= 13 { w += $9 + $13; n++ } END { printf "%d wrong in %d rows", w, n }' "${files[@]}"
}
bus() { # bus bandwidth in GB/s from SIZE bytes, TIME us and NP ranks, 3 digits
    awk -v s="$1" -v t="$2" -v n="$3" 'BEGIN { if (t == "-" || t + 0 == 0) print "-"; else printf "%.3g", s / (t * 1e3) * 2 * (n - 1) / n }'
}
ratio() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'
}
best() { # the larger of two numbers ("-" counts as missing)
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-") print b; else if (b == "-") print a; else print (a + 0 >= b + 0 ? a : b) }'
}
lowest() {
    awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-") print b; else if (b == "-") print a; else print (a + 0 <= b + 0 ? a : b) }'
}
human() {
    awk -v s="$1" 'BEGIN { if (s >= 1048576) printf "%d MiB", s / 1048576; else if (s >= 1024) printf "%d KiB", s / 1024; else printf "%d B", s }'
}

declare -A RATIO
SIZES=()
s=8
max=$(awk '$1 !~ /^#/ && NF >= 13 && $1 + 0 > m { m = $1 + 0 } END { print m }' /dev/null "$OUT_DIR"/r*/*-large.txt 2>/dev/null || true)
[ -n "$max" ] && [ "$max" != 0 ] || max=268435456
while [ "$s" -le "$max" ]; do SIZES+=("$s"); s=$((s * 2)); done

{
    echo "### All-reduce float32 sum, busbw (GB/s, out-of-place)"
    echo
    echo "Revision $(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD -- . ':!docs' ':!README.md' 2>/dev/null || echo '+changes'), $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')),"
    echo "$(mpirun.openmpi --version 2>/dev/null | head -1)$( [ "$COMPARE_MPICH" = 1 ] && echo ", MPICH $(mpichversion 2>/dev/null | awk '/Version:/ {print $3}')")$( [ "$COMPARE_IMPI" = 1 ] && echo ", Intel MPI $("$IMPI_DIR/prefix/bin/mpiexec.hydra" --version 2>/dev/null | sed -n 's/.*Version \([^ ]*\).*/\1/p' | head -1) (I_MPI_FABRICS=shm)")."
    [ -n "$IMPI_REASON" ] && echo "Intel MPI: not measured here: $IMPI_REASON."
    echo "Load average (1/5/15 min) at start: $LOAD_START; at end: $LOAD_END; runs took ${ELAPSED} s."
    echo "Iterations: $SMALL_ITERS (8 B-64 KiB), $MID_ITERS (128 KiB-4 MiB), $LARGE_ITERS (8 MiB and up)."
    echo "Rounds: ${ROUNDS:-1}, one after another; every figure is its library's fastest round at that size."
    echo
    for np in 2 4; do
        hdr="| size | rccl-rs ${np}p | OpenMPI default ${np}p | OpenMPI ring ${np}p |"
        sep="|---:|---:|---:|---:|"
        mpich_runs "$np" && { hdr+=" MPICH ${np}p |"; sep+="---:|"; }
        [ "$COMPARE_IMPI" = 1 ] && { hdr+=" Intel MPI ${np}p |"; sep+="---:|"; }
        hdr+=" rccl-rs / best OpenMPI | rccl-rs / best peer |"
        sep+="---:|---:|"
        echo "$hdr"
        echo "$sep"
        below=()
        for size in "${SIZES[@]}"; do
            o=$(field "$size" 6 ours-$np-{small,mid,large}.txt)
            d=$(field "$size" 6 ompi-$np-{small,mid,large}.txt)
            r=$(field "$size" 6 ompiring-$np-{small,mid,large}.txt)
            row="| $(human "$size") | $(bus "$size" "$o" "$np") | $(bus "$size" "$d" "$np") | $(bus "$size" "$r" "$np") |"
            peer=$(lowest "$d" "$r")
            if mpich_runs "$np"; then
                m=$(field "$size" 6 mpich-$np-{small,mid,large}.txt)
                row+=" $(bus "$size" "$m" "$np") |"
                peer=$(lowest "$peer" "$m")
            fi
            if [ "$COMPARE_IMPI" = 1 ]; then
                i=$(field "$size" 6 impi-$np-{small,mid,large}.txt)
                row+=" $(bus "$size" "$i" "$np") |"
                peer=$(lowest "$peer" "$i")
            fi
            # Same size, same factor: the busbw ratio is the inverse time ratio.
            q=$(ratio "$(lowest "$d" "$r")" "$o")
            row+=" $q | $(ratio "$peer" "$o") |"
            echo "$row"
            RATIO[$np:$size]=$q
        done
        echo
    done

    echo "### 8-byte all-reduce latency (us, out-of-place, $LAT_ITERS iterations)"
    echo
    echo "Fastest and median of every sample: $LAT_SAMPLES runs per round for the defaults, one per round for the forced protocols."
    echo
    echo "| setting | 2 processes, fastest | median | 4 processes, fastest | median |"
    echo "|---|---:|---:|---:|---:|"
    for np_row in "rccl-rs default:ours-%s-lat" "rccl-rs NCCL_PROTO=LL, board off:ours-%s-proto-LL" \
        "rccl-rs NCCL_PROTO=LL128, board off:ours-%s-proto-LL128" \
        "rccl-rs NCCL_PROTO=Simple, board off:ours-%s-proto-Simple" \
        "OpenMPI default:ompi-%s-lat" "OpenMPI ring:ompiring-%s-lat"; do
        label=${np_row%%:*}
        pat=${np_row#*:}
        # shellcheck disable=SC2059
        row="| $label |"
        for np in 2 4; do
            # shellcheck disable=SC2059
            f="$(printf "$pat" "$np").txt"
            row+=" $(field 8 6 "$f") | $(median_at 8 6 "$f") |"
        done
        echo "$row"
    done
    if [ "$COMPARE_MPICH" = 1 ]; then
        echo "| MPICH default | $(field 8 6 "mpich-2-lat.txt") | $(median_at 8 6 "mpich-2-lat.txt") | $(field 8 6 "mpich-4-lat.txt") | $(median_at 8 6 "mpich-4-lat.txt") |"
    fi
    if [ "$COMPARE_IMPI" = 1 ]; then
        echo "| Intel MPI default | $(field 8 6 "impi-2-lat.txt") | $(median_at 8 6 "impi-2-lat.txt") | $(field 8 6 "impi-4-lat.txt") | $(median_at 8 6 "impi-4-lat.txt") |"
    fi
    echo
    # peer_lat NP: the fastest 8-byte sample of every MPI measured at NP.
    peer_lat() {
        local v f
        v=$(lowest "$(field 8 6 "ompi-$1-lat.txt")" "$(field 8 6 "ompiring-$1-lat.txt")")
        for f in mpich impi; do v=$(lowest "$v" "$(field 8 6 "$f-$1-lat.txt")"); done
        echo "$v"
    }
    echo "Latency ratio rccl-rs default / best peer: 2p $(ratio "$(field 8 6 "ours-2-lat.txt")" "$(peer_lat 2)"), 4p $(ratio "$(field 8 6 "ours-4-lat.txt")" "$(peer_lat 4)") (below 1 is better)."
    echo
    echo "### Targets"
    echo
    for size in 65536 1048576 16777216 268435456; do
        q=${RATIO[2:$size]:-"-"}
        ok=$(awk -v q="$q" 'BEGIN { print (q != "-" && q + 0 >= 1.5) ? "holds" : "does not hold" }')
        echo "* 2 processes, $(human "$size"): busbw ratio $q (target >= 1.5): $ok"
    done
    for np in 2 4; do
        o=$(field 8 6 "ours-$np-lat.txt")
        m=$(lowest "$(field 8 6 "ompi-$np-lat.txt")" "$(field 8 6 "ompiring-$np-lat.txt")")
        ok=$(awk -v o="$o" -v m="$m" 'BEGIN { print (o != "-" && m != "-" && o + 0 <= m + 0) ? "holds" : "does not hold" }')
        om=$(median_at 8 6 "ours-$np-lat.txt")
        mm=$(lowest "$(median_at 8 6 "ompi-$np-lat.txt")" "$(median_at 8 6 "ompiring-$np-lat.txt")")
        echo "* $np processes, 8-byte latency: rccl-rs $o us, best OpenMPI $m us (target: at or below): $ok; medians $om and $mm us"
    done
    n_ok=0
    n_all=0
    short=()
    for size in "${SIZES[@]}"; do
        q=${RATIO[4:$size]:-"-"}
        n_all=$((n_all + 1))
        if awk -v q="$q" 'BEGIN { exit !(q != "-" && q + 0 >= 1.0) }'; then
            n_ok=$((n_ok + 1))
        else
            short+=("$(human "$size")")
        fi
    done
    echo "* 4 processes, busbw at or above the better OpenMPI setting: $n_ok of $n_all sizes$( [ "${#short[@]}" -gt 0 ] && printf '; below at: %s' "$(IFS=,; echo "${short[*]}" | sed 's/,/, /g')")"
    echo
    echo "Data checks: rccl-rs $(wrong_total "$OUT_DIR"/r*/ours-*.txt); OpenMPI $(wrong_total "$OUT_DIR"/r*/ompi*.txt)$( [ "$COMPARE_MPICH" = 1 ] && echo "; MPICH $(wrong_total "$OUT_DIR"/r*/mpich-*.txt)")$( [ "$COMPARE_IMPI" = 1 ] && echo "; Intel MPI $(wrong_total "$OUT_DIR"/r*/impi-*.txt)")."
    echo
} | tee "$REPORT"
log "report: $REPORT; raw outputs: $OUT_DIR/"
