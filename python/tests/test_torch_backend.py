"""torch.distributed on rccl-rs: the "rcclrs" backend against gloo.

Each world size (2 and 4 processes) runs every case of _collectives.py in
one set of processes (starting Python with torch is most of the cost);
the tests below check the cases of one collective each.
"""

import importlib.metadata
import json
import pathlib
import re
import subprocess
import sys
import warnings

import pytest

from _ranks import PYTHON_DIR, env_with_package, run_ranks

REPO = PYTHON_DIR.parent

FAMILIES = [
    "all_reduce", "broadcast", "reduce", "all_gather", "all_gather_into_tensor",
    "reduce_scatter_tensor", "reduce_scatter", "all_to_all_single", "all_to_all",
    "gather", "scatter", "send_recv", "isend_irecv", "batch_isend_irecv", "barrier", "functional",
    "coalesced", "sparse", "monitored_barrier", "errors",
]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda n: f"{n}procs")
def collective_results(request, tmp_path_factory):
    world = request.param
    return world, run_ranks("_collectives.py", world, tmp_path_factory.mktemp(f"coll{world}"), timeout=150)


@pytest.mark.parametrize("family", FAMILIES)
def test_collective_matches_gloo(collective_results, family):
    world, results = collective_results
    names = [n for n in results[0] if n.split("[")[0] == family]
    assert names, f"no {family} case ran"
    failures = [f"rank {r}: {n}\n{res[n]}" for n in names for r, res in enumerate(results) if res.get(n) != "ok"]
    assert not failures, "\n".join(failures)


def test_every_case_ran_on_every_rank(collective_results):
    world, results = collective_results
    assert len(results) == world
    names = set(results[0])
    assert all(set(r) == names for r in results)
    assert {n.split("[")[0] for n in names} == set(FAMILIES)
    assert len(names) > 100


def test_timeout_is_a_python_exception(tmp_path):
    """A peer that never joins an all_reduce: the group's timeout (3 s)
    bounds the wait and the failure surfaces as an exception."""
    (r0, _) = run_ranks("_timeout.py", 2, tmp_path, args=[3], timeout=90)
    assert r0["raised"] == "RcclError", r0
    assert r0["is_dist_backend_error"], r0
    assert 2.5 <= r0["elapsed"] < 30, r0
    assert "timed out after 3s" in r0["message"], r0["message"]
    # What torch's callers (and its own tests, as for gloo) look for.
    assert re.search(" (Timed out|closed|timeout) ", r0["message"]), r0["message"]
    assert "earlier failure" in r0["after"], r0["after"]


@pytest.mark.parametrize("world", [2, 4])
def test_receive_from_any_source(tmp_path, world):
    """dist.recv / dist.irecv without src on rank 0 while the others send
    it two messages each: every message arrives once, with its sender's
    rank, as under gloo; also after a receive that names its peer."""
    results = run_ranks("_any_source.py", world, tmp_path, timeout=90)
    r0 = results[0]
    everyone_twice = sorted(list(range(1, world)) * 2)
    for case in ("rcclrs", "gloo", "rcclrs_after_named", "gloo_after_named"):
        assert sorted(r0[case]) == everyone_twice, (case, r0)
    assert r0["rcclrs_after_named"][0] == world - 1
    for rank, r in enumerate(results):
        assert r["ring"] == [(rank - 1) % world] * 7, (rank, r)


def test_subgroups_and_a_default_group_created_twice(tmp_path):
    """A group that leaves ranks out, then groups over everyone; the default
    group destroyed and created again over the same store."""
    world = 4
    results = run_ranks("_groups.py", world, tmp_path, timeout=120)
    everyone = world * (world + 1) / 2
    for rank, r in enumerate(results):
        expected = ([1 + 2] if rank < 2 else []) + [everyone, everyone]
        assert r["sums"] == expected * 2, (rank, r)


def test_library_lookup_says_how_to_build(tmp_path, monkeypatch):
    sys.path.insert(0, str(PYTHON_DIR))
    from rcclrs import _nccl

    monkeypatch.setenv("RCCLRS_LIBRARY", str(tmp_path / "missing.so"))
    with pytest.raises(FileNotFoundError, match="RCCLRS_LIBRARY=.*missing.so: no such file"):
        _nccl.find_library()
    monkeypatch.delenv("RCCLRS_LIBRARY")
    monkeypatch.setenv("CARGO_TARGET_DIR", str(tmp_path))
    monkeypatch.setattr(_nccl, "_repo_root", lambda: tmp_path / "repo")
    with pytest.raises(FileNotFoundError, match="cargo build --release -p rccl-ffi"):
        _nccl.find_library()
    built = tmp_path / "release" / "librcclrs.so"
    built.parent.mkdir()
    built.write_bytes(b"")
    assert _nccl.find_library() == built


def test_group_timeout_becomes_rccl_timeout_ms_unless_the_user_set_it(monkeypatch):
    sys.path.insert(0, str(PYTHON_DIR))
    from rcclrs import backend

    class Group:
        _apply_timeout = backend.ProcessGroupRccl._apply_timeout

    g = Group()
    monkeypatch.delenv("RCCL_TIMEOUT_MS", raising=False)
    monkeypatch.setattr(backend, "_written_timeout", None)
    g._timeout = 2.5
    g._apply_timeout()
    assert backend.os.environ["RCCL_TIMEOUT_MS"] == "2500"
    g._timeout = 60
    g._apply_timeout()  # a later group with another timeout
    assert backend.os.environ["RCCL_TIMEOUT_MS"] == "60000"
    monkeypatch.setenv("RCCL_TIMEOUT_MS", "1234")  # the user's
    g._apply_timeout()
    assert backend.os.environ["RCCL_TIMEOUT_MS"] == "1234"


def _installed() -> bool:
    eps = importlib.metadata.entry_points()
    group = eps.select(group="torch.distributed.backends") if hasattr(eps, "select") \
        else eps.get("torch.distributed.backends", [])
    return any(ep.name == "rcclrs" for ep in group)


@pytest.mark.skipif(not _installed(), reason="the package is not installed (pip install -e python/)")
def test_entry_point_registers_backend(tmp_path):
    """Installed, init_process_group("rcclrs") works without importing rcclrs."""
    results = run_ranks("_entrypoint.py", 2, tmp_path, timeout=90, env={"PYTHONPATH": ""})
    assert [r["sum"] for r in results] == [3.0, 3.0]
    assert all(r["backend"] == "rcclrs" for r in results)


def _torchrun(backend: str, procs: int, tmp_path: pathlib.Path, steps: int) -> dict:
    out = tmp_path / f"{backend}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={procs}",
           str(REPO / "examples" / "torch_ddp.py"), "--backend", backend, "--steps", str(steps),
           "--json", str(out)]
    proc = subprocess.run(cmd, env=env_with_package(), capture_output=True, text=True, timeout=150)
    if proc.returncode != 0 and backend == "gloo":
        # gloo is the reference, not the software under test: a gloo rank
        # has been seen to abort (SIGABRT) in its shutdown after the last
        # step, once in many runs. One more run tells that apart from a
        # reference that cannot run here; the first failure stays visible.
        warnings.warn(f"gloo reference run failed (exit {proc.returncode}), running it again:\n"
                      f"{proc.stderr[-1500:]}")
        proc = subprocess.run(cmd, env=env_with_package(), capture_output=True, text=True, timeout=150)
    assert proc.returncode == 0, f"{backend}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return json.loads(out.read_text())


def test_ddp_example_same_loss_as_gloo(tmp_path):
    """examples/torch_ddp.py under torchrun, 2 processes: the same losses
    and parameters bit for bit (a sum of two floats does not depend on
    the order, so both backends compute the same gradients)."""
    steps = 20
    ours = _torchrun("rcclrs", 2, tmp_path, steps)
    gloo = _torchrun("gloo", 2, tmp_path, steps)
    assert len(ours["losses"]) == steps
    assert float.fromhex(ours["losses"][-1]) < float.fromhex(ours["losses"][0]), "the model did not train"
    assert ours["losses"] == gloo["losses"]
    assert ours["params_hex"] == gloo["params_hex"]


def _deterministic_run(tmp_path: pathlib.Path, name: str, world: int, env: dict) -> list[dict]:
    workdir = tmp_path / name
    workdir.mkdir()
    return run_ranks("_deterministic.py", world, workdir, timeout=150, env=env)


def test_deterministic_mode_gives_the_same_parameters_whatever_the_algorithm(tmp_path):
    """NCCL_DETERMINISTIC=1, 2 ranks: three SGD steps run twice under the
    tuner's choice, once under NCCL_ALGO=ring and once under tree, end in
    the same parameters bit for bit, and every summed gradient equals the
    documented reference order (each rank checks it against every rank's
    gradients gathered over gloo)."""
    runs = {}
    for name, algo in [("default", None), ("again", None), ("ring", "ring"), ("tree", "tree")]:
        env = {"NCCL_DETERMINISTIC": "1"}
        if algo:
            env["NCCL_ALGO"] = algo
        runs[name] = _deterministic_run(tmp_path, name, 2, env)
    for name, results in runs.items():
        for rank, r in enumerate(results):
            assert r["grads_match_reference"] and all(r["grads_match_reference"]), (name, rank, r)
            assert r["shard_matches_reference"], (name, rank, r)
    hashes = {(name, rank): r["params_sha256"] for name, results in runs.items() for rank, r in enumerate(results)}
    assert len(set(hashes.values())) == 1, hashes
    grads = {(name, rank): r["grads_sha256"] for name, results in runs.items() for rank, r in enumerate(results)}
    assert len(set(grads.values())) == 1, grads


def test_deterministic_mode_at_four_ranks_and_without_it(tmp_path):
    """4 ranks, where the order of a sum can change its bits: with the mode,
    ring and tree agree with each other and with the reference; without
    it, the same steps under ring and under tree give different gradient
    sums (so the test above could fail)."""
    world = 4
    on = {algo: _deterministic_run(tmp_path, f"on-{algo}", world, {"NCCL_DETERMINISTIC": "1", "NCCL_ALGO": algo})
          for algo in ("ring", "tree")}
    for algo, results in on.items():
        for rank, r in enumerate(results):
            assert all(r["grads_match_reference"]) and r["shard_matches_reference"], (algo, rank, r)
    assert len({r["params_sha256"] for results in on.values() for r in results}) == 1, on
    # Without the mode "tree" would refuse the reduce-scatter (no tree
    # implements it), so the all-reduces alone are sent to the tree.
    off = {algo: _deterministic_run(tmp_path, f"off-{algo}", world, {"NCCL_DETERMINISTIC": "0", "NCCL_ALGO": algo})
           for algo in ("ring", "allreduce:tree")}
    assert off["ring"][0]["grads_sha256"] != off["allreduce:tree"][0]["grads_sha256"], off
    for results in off.values():
        assert len({r["grads_sha256"] for r in results}) == 1, results  # bitwise equal on every rank all the same
