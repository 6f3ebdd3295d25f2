#!/usr/bin/env python3
"""PyTorch's own distributed tests against a backend: the installed torch's
``DistributedTest._DistTestBase`` (torch/testing/_internal/distributed/
distributed_test.py), driven as upstream's test/distributed/
test_distributed_spawn.py drives it, with an init file as upstream's
run_test.py gives it: each test starts WORLD_SIZE processes that create a
default group of the backend and run the test.

Usage:
    scripts/torch-dist-suite.py --backend gloo --backend rcclrs   # what CI runs
    scripts/torch-dist-suite.py -k 'all_gather_coalesced|any_source'
    scripts/torch-dist-suite.py --start-method spawn --backend gloo --backend rcclrs

With several backends it runs the suite under each in turn, prints a line
per test, the counts of each backend and the tests that pass under the
first but not under another (exiting non-zero if there is one). With one
backend it exits non-zero when a test fails. --json writes every test's
outcome (and failure) per backend; each backend's full output goes to
target/torch-dist-suite/BACKEND.log.

The ranks start by fork by default: a test then starts in a fraction of a
second, where spawn (upstream's way, --start-method spawn) imports torch
again in every rank of every test. On 2 cores the whole suite takes about
a minute per backend with fork; most of its tests need GPUs and skip.

The suite selects its tests by backend name. For "rcclrs" the driver has
it select them as it does for gloo, because rcclrs is a CPU backend meant
to replace gloo: it imports the suite with BACKEND=gloo (the decorators
that key on "gloo" -- skip_but_pass_in_sandcastle_if(BACKEND != "gloo"),
require_backend_is_available({"gloo"}), the DistTestCases feature tables
-- are evaluated then), and runs it with BACKEND set to a name that is
"rcclrs" (what the tests pass to init_process_group and compare
get_backend() with) but also compares equal to "gloo", so that the
branches in test bodies that key on "gloo" take gloo's (CPU) path.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Set by the driver for the processes that run the suite (and inherited by
# the ranks they spawn, which import this file again): the backend under test.
SUITE_BACKEND_ENV = "RCCLRS_TORCH_SUITE_BACKEND"
# How the ranks start: "fork" (the default: a test takes a fraction of a
# second to start instead of seconds) or "spawn", as upstream starts them.
START_METHOD_ENV = "RCCLRS_TORCH_SUITE_START"


class _GlooAlike(str):
    """A backend name that also compares equal to "gloo" (see the module's
    docstring). Hashes as its own name: set membership is by name."""

    def __eq__(self, other):
        return str.__eq__(self, other) or other == "gloo"

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


def _load_suite(backend: str):
    """Imports the suite for `backend` and returns the test class (as
    upstream's test_distributed_spawn.py builds it)."""
    import torch.multiprocessing

    os.environ.setdefault("WORLD_SIZE", "2")
    if backend == "gloo":
        os.environ["BACKEND"] = backend
        from torch.testing._internal.distributed import distributed_test as suite
    else:
        __import__(backend)  # registers the backend with torch.distributed
        os.environ["BACKEND"] = "gloo"
        from torch.testing._internal.distributed import distributed_test as suite
        os.environ["BACKEND"] = backend
        suite.BACKEND = _GlooAlike(backend)

    class TestDistBackendWithSpawn(suite.TestDistBackend, suite.DistributedTest._DistTestBase):
        def setUp(self):
            super().setUp()
            start_method = os.environ.get(START_METHOD_ENV, "fork")
            self._start_processes(torch.multiprocessing.get_context(start_method).Process)

    # Pickled by name when the ranks are spawned.
    TestDistBackendWithSpawn.__qualname__ = TestDistBackendWithSpawn.__name__
    return TestDistBackendWithSpawn


if os.environ.get(SUITE_BACKEND_ENV):
    # Module level, so that ranks started by spawn (which imports this
    # file again) find the class.
    TestDistBackendWithSpawn = _load_suite(os.environ[SUITE_BACKEND_ENV])


class _Result(unittest.TextTestResult):
    """Records each test's outcome (passed, failed, skipped) and detail,
    and prints a line per test to `progress`."""

    progress = sys.stdout

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict] = {}
        self._started = 0.0

    def startTest(self, test):
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test, outcome, detail=""):
        name = test.id().rsplit(".", 1)[-1]
        seconds = round(time.monotonic() - self._started, 1)
        self.outcomes[name] = {"outcome": outcome, "seconds": seconds, "detail": detail[-4000:]}
        note = f"  ({detail.splitlines()[0][:100]})" if outcome == "skipped" and detail else ""
        print(f"{outcome:>7} {seconds:6.1f}s {name}{note}", file=self.progress, flush=True)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")


def _selected(names: list[str], patterns: list[str]) -> list[str]:
    regexes = [re.compile(p) for p in patterns]
    return [n for n in names if any(r.search(n) for r in regexes)]


def _run_suite(args) -> int:
    """In the process that runs the suite for one backend: runs the chosen
    tests and writes their outcomes to args.out."""
    cls = TestDistBackendWithSpawn
    names = unittest.TestLoader().getTestCaseNames(cls)
    chosen = _selected(names, args.k) if args.k else names
    if args.list:
        print("\n".join(chosen))
        return 0
    if args.log:
        # The tests' own output (and their ranks', which inherit these
        # descriptors) goes to the log; a line per test to the terminal.
        _Result.progress = os.fdopen(os.dup(1), "w", buffering=1)
        log = open(args.log, "w")
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    suite = unittest.TestSuite(cls(n) for n in chosen)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2, resultclass=_Result)
    result = runner.run(suite)
    with open(args.out, "w") as f:
        json.dump(result.outcomes, f, indent=1, sort_keys=True)
    return 0


def _counts(outcomes: dict) -> dict:
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for o in outcomes.values():
        counts[o["outcome"]] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", action="append",
                        help="backend to run the suite against (repeatable; default rcclrs)")
    parser.add_argument("-k", action="append", help="only tests whose name matches this regex (repeatable)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test before its ranks are killed")
    parser.add_argument("--start-method", choices=["fork", "spawn"], default="fork",
                        help="how each test starts its ranks (upstream spawns them; fork is faster)")
    parser.add_argument("--json", help="write every test's outcome per backend to this file")
    parser.add_argument("--list", action="store_true", help="list the chosen tests and exit")
    parser.add_argument("--log-dir", default=os.path.join(REPO, "target", "torch-dist-suite"),
                        help="where each backend's full output goes (BACKEND.log; default %(default)s)")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if os.environ.get(SUITE_BACKEND_ENV):
        return _run_suite(args)

    backends = args.backend or ["rcclrs"]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            out = os.path.join(tmp, f"{backend}.json")
            env = dict(os.environ)
            env[SUITE_BACKEND_ENV] = backend
            env["WORLD_SIZE"] = str(args.world_size)
            env[START_METHOD_ENV] = args.start_method
            # As upstream's run_test.py runs it with an init file (the
            # tests that re-create the default group need one).
            env["INIT_METHOD"] = "file://" + os.path.join(tmp, "shared_init_file")
            env["DISTRIBUTED_TESTS_DEFAULT_TIMEOUT"] = str(args.timeout)
            env.setdefault("OMP_NUM_THREADS", "1")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.join(REPO, "python"), env.get("PYTHONPATH")]))
            os.makedirs(args.log_dir, exist_ok=True)
            log = os.path.join(args.log_dir, f"{backend}.log")
            cmd = [sys.executable, os.path.abspath(__file__), "--out", out, "--world-size", str(args.world_size),
                   "--log", log]
            cmd += ["--list"] * args.list
            for k in args.k or []:
                cmd += ["-k", k]
            print(f"== {backend}: {len(args.k or []) and 'the tests matching ' + ' or '.join(args.k) or 'every test'}, "
                  f"{args.world_size} processes, started by {args.start_method} (output: {log})", flush=True)
            started = time.monotonic()
            code = subprocess.run(cmd, env=env, cwd=tmp).returncode
            if code != 0:
                with open(log) as f:
                    tail = f.read()[-6000:]
                print(f"{tail}\n{backend}: the suite's runner exited with {code}", file=sys.stderr)
                return code
            if args.list:
                continue
            with open(out) as f:
                results[backend] = json.load(f)
            print(f"== {backend}: {_counts(results[backend])} in {time.monotonic() - started:.0f} s", flush=True)
    if args.list:
        return 0

    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)
    print("\n== counts")
    for backend, outcomes in results.items():
        c = _counts(outcomes)
        print(f"{backend:>8}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
    for backend, outcomes in results.items():
        for n, o in sorted(outcomes.items()):
            if o["outcome"] == "failed":
                print(f"\n== {backend}: {n} failed\n{o['detail'][-3000:]}")
    status = 0
    if len(backends) == 1:
        failed = sorted(n for n, o in results[backends[0]].items() if o["outcome"] == "failed")
        for n in failed:
            print(f"FAILED {n}")
        status = 1 if failed else 0
    else:
        reference = results[backends[0]]
        for backend in backends[1:]:
            lost = sorted(n for n, o in reference.items()
                          if o["outcome"] == "passed" and results[backend].get(n, {}).get("outcome") != "passed")
            for n in lost:
                print(f"{backends[0]} passes, {backend} does not: {n} "
                      f"({results[backend].get(n, {}).get('outcome', 'not run')})")
            status = status or (1 if lost else 0)
    return status


if __name__ == "__main__":
    sys.exit(main())
