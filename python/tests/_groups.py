"""One rank of the group-lifecycle test. Usage: _groups.py RANK WORLD STORE OUT_JSON

A subgroup that leaves ranks out, a group over everyone after it, and the
default group created, destroyed and created again over the same store
(the same group name comes back: the new group must not pick up the old
one's unique id).
"""

import json
import sys

import torch
import torch.distributed as dist

import rcclrs

rank, world, store_path, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
store = dist.FileStore(store_path, world)
sums = []


def total(group=None):
    x = torch.tensor([float(rank + 1)])
    dist.all_reduce(x, group=group)
    return x.item()


for round_ in range(2):
    dist.init_process_group("rcclrs", store=store, rank=rank, world_size=world)
    assert isinstance(dist.group.WORLD, rcclrs.ProcessGroupRccl)
    low = dist.new_group([0, 1], backend="rcclrs")  # ranks 2.. are not in it
    everyone = dist.new_group(backend="rcclrs")
    if rank < 2:
        sums.append(total(low))
    sums.append(total(everyone))
    sums.append(total())
    dist.destroy_process_group()

with open(out_path, "w") as f:
    json.dump({"sums": sums}, f)
