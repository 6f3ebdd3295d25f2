#!/usr/bin/env bash
# Regenerates the measured part of docs/PERF.md.
#
# Runs scripts/compare-mpi.sh (rccl-rs' all-reduce against every MPI it can
# have here: OpenMPI, MPICH, Intel MPI; its environment knobs pass
# through, REPORT_ONLY=1 included), then rewrites docs/PERF.md from the
# top down to the marker line with what was measured, the command, the
# date (UTC), the revision and the report's tables. Everything from the
# marker line on is written by hand and kept as it is.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
DOC=docs/PERF.md
MARKER='<!-- Everything above this line is written by scripts/perf-report.sh; everything below is written by hand. -->'

grep -qxF "$MARKER" "$DOC" || { echo "$DOC has no marker line: $MARKER" >&2; exit 1; }

"$ROOT/scripts/compare-mpi.sh" >/dev/null

# Edits to the docs change no figure, so they do not mark the revision.
REVISION="$(git rev-parse --short=12 HEAD)$(git diff --quiet HEAD -- . ':!docs' ':!README.md' 2>/dev/null || echo '+changes')"
{
    cat <<HEAD
# Performance

## Summary

**What is measured.** All-reduce (float32 sum) on host memory, one host,
one process per rank: rccl-rs' \`all_reduce_perf\` against \`MPI_Allreduce\`
of every MPI library the script could run here, each built from
\`benches/mpi/allreduce_mpi.c\` (nccl-tests' timing and table) and run
with its own launcher. NCCL needs GPUs, so it has no column;
[SIMULATOR.md](SIMULATOR.md) sets the model beside NCCL's published H100
figures. [The machine](#the-machine-and-how-to-measure-on-it) is a shared
2-vCPU cloud VM without a GPU whose speed moves by up to 2x: only figures of
one run compare, and each below is its library's fastest of interleaved
rounds.

**Command.** \`scripts/perf-report.sh\` (10-20 minutes) runs
\`scripts/compare-mpi.sh\`, which installs OpenMPI and MPICH with apt-get
and unpacks Intel MPI from PyPI's \`impi-rt\` / \`impi-devel\` into
\`target/impi/\` when missing, and rewrites this page down to the marker
line below; \`target/compare-mpi.md\` holds the same report.

Written $(date -u '+%Y-%m-%d %H:%M UTC') at revision \`$REVISION\`.

HEAD
    cat "$ROOT/target/compare-mpi.md"
    echo "$MARKER"
    sed -n "/^$(printf '%s' "$MARKER" | sed 's/[][\/.*^$]/\\&/g')\$/,\$p" "$DOC" | tail -n +2
} >"$DOC.new"
mv "$DOC.new" "$DOC"
echo "== wrote $DOC (revision $REVISION)" >&2
