"""One rank of the timeout test. Usage: _timeout.py RANK WORLD STORE OUT_JSON SECONDS

Rank 0 all-reduces on an rcclrs group created with a timeout of SECONDS;
rank 1 never joins it and waits (through the store) until rank 0 is done.
"""

import datetime
import json
import os
import sys
import time

os.environ.pop("RCCL_TIMEOUT_MS", None)  # the group's timeout is under test

import torch
import torch.distributed as dist

import rcclrs

rank, world, store_path, out_path, seconds = sys.argv[1:6]
rank, world, seconds = int(rank), int(world), float(seconds)
store = dist.FileStore(store_path, world)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
group = dist.new_group(backend="rcclrs", timeout=datetime.timedelta(seconds=seconds))
result = {}
if rank == 0:
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4), group=group)
        result["raised"] = None
    except Exception as e:  # noqa: BLE001 - what is raised is the result
        result.update(raised=type(e).__name__, message=str(e),
                      is_dist_backend_error=isinstance(e, dist.DistBackendError))
    result["elapsed"] = time.monotonic() - start
    try:
        dist.all_reduce(torch.ones(4), group=group)
        result["after"] = "no error"
    except rcclrs.RcclError as e:
        result["after"] = str(e)
    store.set("rank0_done", "1")
else:
    store.wait(["rank0_done"], datetime.timedelta(seconds=60))
with open(out_path, "w") as f:
    json.dump(result, f)
