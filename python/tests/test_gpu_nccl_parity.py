"""The torch program of the GPU check (gpu_nccl_parity.py, run by
scripts/gpu-check-ipc.sh on cuda:0 with backend "nccl" against gloo on the
CPU) checks itself here under gloo on the CPU: every collective matches its
reference, and a run compares equal to itself and unequal to a tampered
copy, so the GPU check's comparison can fail.
"""

import json
import pathlib
import subprocess
import sys

PROGRAM = pathlib.Path(__file__).with_name("gpu_nccl_parity.py")


def test_the_parity_program_checks_clean_under_gloo_and_its_comparison_can_fail(tmp_path):
    out = tmp_path / "gloo.json"
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         str(PROGRAM), "--backend", "gloo", "--device", "cpu", "--out", str(out)],
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 wrong (gloo on cpu)" in run.stdout
    result = json.loads(out.read_text())
    names = set(result["results"])
    for op in ["all_reduce.sum.int32", "all_reduce.avg.float32", "all_reduce.premul_sum.bfloat16",
               "broadcast.int32", "reduce.float32", "all_gather_into_tensor.int32",
               "reduce_scatter_tensor.float32", "all_to_all_single.bfloat16", "send_recv.float32",
               "new_group.all_reduce.int32", "graph.all_reduce.float32"]:
        assert op in names, sorted(names)

    def compare(other):
        return subprocess.run([sys.executable, str(PROGRAM), "--compare", str(out), str(other)],
                              capture_output=True, text=True, timeout=60)

    assert compare(out).returncode == 0
    tampered = tmp_path / "tampered.json"
    result["results"]["reduce.float32"][0] += 1
    tampered.write_text(json.dumps(result))
    different = compare(tampered)
    assert different.returncode == 1 and "differs: reduce.float32" in different.stdout
