#!/usr/bin/env python3
"""all_reduce under torch.distributed: backend "rcclrs" against gloo.

Starts --procs processes on this host (a FileStore joins them). Each one
creates an rcclrs group and a gloo group and, size by size, times
synchronous float32 SUM all_reduce calls on the same tensor with each
backend in turn (warm-up first, a barrier before each timed loop). The
time per call is averaged over the ranks; busbw = bytes / time x 2(n-1)/n,
as nccl-tests report it. Rank 0 prints a markdown table and the load
average before and after.

    python3 scripts/torch-bench.py                       # 2 processes, 8 B .. 256 MiB
    python3 scripts/torch-bench.py --procs 4 --iters-scale 0.2 --sizes 8,1M

Needs librcclrs.so (cargo build --release -p rccl-ffi) and torch.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

# size -> timed iterations at --iters-scale 1
DEFAULT_ITERS = {8: 2000, 64 << 10: 500, 1 << 20: 100, 16 << 20: 20, 256 << 20: 5}
UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1] if text and text[-1] in UNITS else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


def human(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def iters_for(size: int, scale: float) -> int:
    base = DEFAULT_ITERS.get(size)
    if base is None:  # between the defaults: about 100 MB of traffic
        base = max(5, min(2000, (100 << 20) // max(size, 1)))
    return max(1, int(base * scale))


def loadavg() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(REPO / "python"))
    import rcclrs  # noqa: F401 - registers the backend

    rank, world = args.rank, args.procs
    if args.bind:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.FileStore(args.store, world), rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=600))
    groups = {name: dist.new_group(backend=name) for name in args.backends}
    control = dist.group.WORLD  # barriers and the gathering of timings

    rows = []
    for size in args.sizes:
        n = max(1, size // 4)
        t = torch.zeros(n, dtype=torch.float32)  # zeros: repeated sums stay exact
        iters = iters_for(size, args.iters_scale)
        row = {"bytes": n * 4, "iters": iters}
        for name in args.backends:
            g = groups[name]
            for _ in range(min(iters, 5)):
                dist.all_reduce(t, group=g)
            dist.barrier(group=control)
            start = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t, group=g)
            mine = (time.perf_counter() - start) / iters
            # data check: ones sum to world on every element
            check = torch.ones(n, dtype=torch.float32)
            dist.all_reduce(check, group=g)
            mine = torch.tensor([mine, float(torch.all(check == world))], dtype=torch.float64)
            everyone = [torch.empty(2, dtype=torch.float64) for _ in range(world)]
            dist.all_gather(everyone, mine, group=control)
            times = [float(e[0]) for e in everyone]
            oks = [bool(e[1]) for e in everyone]
            row[name] = {"seconds": sum(times) / world, "ok": all(oks)}
        rows.append(row)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def table(rows, backends, procs) -> str:
    factor = 2 * (procs - 1) / procs
    ours, other = "rcclrs", "gloo"
    head = "| size | iters |"
    rule = "|---:|---:|"
    for b in backends:
        head += f" {b} time (us) | {b} busbw (GB/s) |"
        rule += "---:|---:|"
    if ours in backends and other in backends:
        head += " busbw rcclrs / gloo |"
        rule += "---:|"
    lines = [head, rule]
    for row in rows:
        line = f"| {human(row['bytes'])} | {row['iters']} |"
        bw = {}
        for b in backends:
            s = row[b]["seconds"]
            bw[b] = row["bytes"] / s * factor / 1e9
            flag = "" if row[b]["ok"] else " WRONG"
            line += f" {s * 1e6:.2f}{flag} | {bw[b]:.3g} |"
        if ours in backends and other in backends:
            line += f" {bw[ours] / bw[other]:.2f} |"
        lines.append(line)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--sizes", default="8,64K,1M,16M,256M", help="bytes per rank, comma-separated (K, M, G)")
    p.add_argument("--iters-scale", type=float, default=1.0,
                   help="multiplies the timed iterations (8 B: 2000, 64 KiB: 500, 1 MiB: 100, 16 MiB: 20, 256 MiB: 5)")
    p.add_argument("--backends", default="rcclrs,gloo")
    p.add_argument("--bind", action="store_true", help="bind rank r to the r-th allowed CPU (as mpirun does)")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--timeout", type=float, default=1800, help="seconds before the run is killed")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--store", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.rank is not None:
        worker(args)
        return

    with tempfile.TemporaryDirectory() as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "out.json")
        before, started = loadavg(), time.time()
        env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
        procs = []
        for r in range(args.procs):
            cmd = [sys.executable, __file__, "--rank", str(r), "--store", store, "--out", out,
                   "--procs", str(args.procs), "--sizes", ",".join(map(str, args.sizes)),
                   "--iters-scale", str(args.iters_scale), "--backends", ",".join(args.backends)]
            if args.bind:
                cmd.append("--bind")
            procs.append(subprocess.Popen(cmd, env=env))
        try:
            deadline = time.monotonic() + args.timeout
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            print(f"killed after {args.timeout} s", file=sys.stderr)
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        if any(proc.returncode for proc in procs):
            sys.exit(f"a rank failed: exit codes {[proc.returncode for proc in procs]}")
        with open(out) as f:
            rows = json.load(f)
        after = loadavg()

    from importlib.metadata import version

    print(f"all_reduce float32 SUM, {args.procs} processes, synchronous calls, "
          f"{'bound to a CPU each' if args.bind else 'not bound to CPUs'}; "
          f"torch {version('torch')}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(started))}, run took {time.time() - started:.0f} s.")
    print(f"Load average (1/5/15 min) at start: {before}; at end: {after}.")
    print()
    print(table(rows, args.backends, args.procs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"procs": args.procs, "load_before": before, "load_after": after, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
