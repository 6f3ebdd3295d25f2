"""One rank of the entry-point test: backend "rcclrs" as the default group,
without importing the package. Usage: _entrypoint.py RANK WORLD STORE OUT_JSON"""

import json
import sys

import torch
import torch.distributed as dist

rank, world, store_path, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
assert "rcclrs" not in sys.modules
dist.init_process_group("rcclrs", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
x = torch.tensor([float(rank + 1)])
dist.all_reduce(x)
with open(out_path, "w") as f:
    json.dump({"sum": x.item(), "backend": dist.get_backend()}, f)
dist.destroy_process_group()
