"""Runs one script as N ranks (subprocesses sharing a FileStore) with a
deadline, so that a hang fails the test instead of blocking it."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
PYTHON_DIR = HERE.parent


def env_with_package(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PYTHON_DIR), env.get("PYTHONPATH")]))
    env.setdefault("PYTHONWARNINGS", "ignore")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    for p in procs:
        p.wait()


def run_ranks(script: str, world: int, workdir: pathlib.Path, args=(), timeout: float = 90,
              env: dict | None = None) -> list[dict]:
    """Runs `script rank world store out_json *args` for every rank; returns
    each rank's JSON output. Fails (AssertionError) when a rank exits
    non-zero or the deadline passes (every rank is then killed)."""
    store = workdir / "store"
    outs = [workdir / f"rank{r}.json" for r in range(world)]
    logs = [open(workdir / f"rank{r}.log", "w") for r in range(world)]
    procs = []
    try:
        for r in range(world):
            cmd = [sys.executable, str(HERE / script), str(r), str(world), str(store), str(outs[r]),
                   *map(str, args)]
            procs.append(subprocess.Popen(cmd, stdout=logs[r], stderr=subprocess.STDOUT,
                                          env=env_with_package(env), start_new_session=True))
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        hung = [r for r, p in enumerate(procs) if p.poll() is None]
    finally:
        stop(procs)
        for f in logs:
            f.close()
    text = "\n".join(f"--- rank {r} (exit {p.returncode}):\n{(workdir / f'rank{r}.log').read_text()[-4000:]}"
                     for r, p in enumerate(procs))
    assert not hung, f"ranks {hung} still running after {timeout} s: killed\n{text}"
    bad = [r for r, p in enumerate(procs) if p.returncode != 0]
    assert not bad, f"ranks {bad} failed\n{text}"
    return [json.loads(o.read_text()) for o in outs]
