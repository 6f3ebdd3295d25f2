#!/usr/bin/env bash
# The cross-process device suite (tests/ipc.rs) run again and again beside
# idle connections to its hand-over sockets: probes watch /proc/net/unix
# for the suite's `@rccl-ipc-*` sockets and keep IDLE connections open to
# them, each silent or holding half a token, one probe as this user and
# (as root) one as uid 65534. Every run must pass as if they were not
# there. A summary ends the output; the logs of failed runs stay in $OUT.
#
#   RUNS   runs of the suite (default 50)
#   IDLE   connections each probe keeps open (default 40)
#   TEST   the test of tests/ipc.rs to run (default the 4-process suite)
#   OUT    where logs go (default: a temporary folder)
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-50}
IDLE=${IDLE:-40}
TEST=${TEST:-the_suite_over_four_processes_through_p2p_ipc}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
cd "$ROOT" || exit 1

BIN=$(cargo test --release --test ipc --no-run 2>&1 |
    grep -o 'target/release/deps/ipc-[0-9a-f]*' | tail -1)
[ -x "$BIN" ] || { echo "no test binary for tests/ipc.rs" >&2; exit 1; }

# Keeps $1 connections open to the newest export sockets, half of them
# holding half a token's worth of bytes; on SIGTERM prints how many it
# made, how many the sockets closed, how many connects were refused (a
# name left in the table by a socket already gone), and how many it
# still held.
PROBE='
import os, random, select, signal, socket, sys, time
want = int(sys.argv[1])
held, made, closed, refused = [], 0, 0, 0
def report(*_):
    print(f"uid {os.geteuid()}: made {made}, closed by the sockets {closed}, connects refused {refused}, held at the end {len(held)}", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, report)
while True:
    names = []
    with open("/proc/net/unix") as table:
        for line in table:
            path = line.split()[-1]
            if path.startswith("@rccl-ipc-"):
                names.append(path[1:])
    for s in list(held):
        if select.select([s], [], [], 0)[0]:
            try:
                gone = s.recv(1) == b""
            except OSError:
                gone = True
            if gone:
                held.remove(s); s.close(); closed += 1
    while names and len(held) < want:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\0" + random.choice(names[-8:]))
            if made % 2:
                s.send(os.urandom(16))
        except OSError:
            # A name left in the table by a socket already gone.
            s.close(); refused += 1; break
        held.append(s); made += 1
    time.sleep(0.005)
'
probes=()
python3 -c "$PROBE" "$IDLE" >"$OUT/probe-user.txt" 2>&1 &
probes+=($!)
if [ "$(id -u)" = 0 ]; then
    # The system's Python: one under root's home is out of its reach.
    setpriv --reuid 65534 --regid 65534 --clear-groups \
        env PATH=/usr/local/bin:/usr/bin:/bin python3 -c "$PROBE" "$IDLE" \
        >"$OUT/probe-65534.txt" 2>&1 &
    probes+=($!)
else
    echo "not root: no probe of another user" >"$OUT/probe-65534.txt"
fi

failures=0
start=$(date +%s)
for run in $(seq 1 "$RUNS"); do
    log="$OUT/run-$run.log"
    t0=$(date +%s)
    if "$BIN" --exact "$TEST" >"$log" 2>&1; then
        echo "run $run: PASS ($(( $(date +%s) - t0 )) s)"
        rm -f "$log"
    else
        failures=$((failures + 1))
        echo "run $run: FAIL ($(( $(date +%s) - t0 )) s), log $log"
    fi
done
for pid in "${probes[@]}"; do
    kill -TERM "$pid"
    wait "$pid"
done
echo "== $RUNS runs of $TEST beside $IDLE idle connections per probe: $failures failed, $(( $(date +%s) - start )) s"
cat "$OUT/probe-user.txt" "$OUT/probe-65534.txt"
[ "$failures" = 0 ]
