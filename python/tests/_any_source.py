"""One rank of the any-source receive test: dist.recv / dist.irecv without
a source on an rcclrs group and on a gloo group, the same messages.
Usage: _any_source.py RANK WORLD STORE OUT_JSON

Apart from _collectives.py: a receive that fails leaves its senders
waiting for good (NCCL sends wait for their receive), so a failure here
must not hold up the other cases.
"""

import datetime
import json
import sys

import torch
import torch.distributed as dist

import rcclrs

rank, world, store_path, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
ours = dist.new_group(backend="rcclrs")
gloo = dist.new_group(backend="gloo")
assert isinstance(ours, rcclrs.ProcessGroupRccl), type(ours)


def from_anyone(g, count: int, first_from=None):
    """Rank 0 takes `count` messages (the first from `first_from` when
    given, the rest from any source: recv and irecv in turn); every other
    rank sends it `count // (world - 1)` tensors filled with its rank.
    Returns, on rank 0, the senders in the order received."""
    senders = []
    if rank == 0:
        for i in range(count):
            t = torch.full((5, 3), -1.0)
            if i == 0 and first_from is not None:
                dist.recv(t, first_from, group=g)
                sender = first_from
            elif i % 2:
                sender = dist.recv(t, group=g)
            else:
                work = dist.irecv(t, group=g)
                work.wait()
                sender = work._source_rank()
            assert bool((t == sender).all()), f"message {i}: from rank {sender}, got {t}"
            senders.append(sender)
    else:
        for _ in range(count // (world - 1)):
            dist.send(torch.full((5, 3), float(rank)), 0, group=g)
    # Else a sender would go on to the next case, whose messages rank 0's
    # any-source receives here could take (as they may).
    dist.barrier(group=gloo)
    return senders


count = 2 * (world - 1)
result = {
    "rcclrs": from_anyone(ours, count),
    "gloo": from_anyone(gloo, count),
    "rcclrs_after_named": from_anyone(ours, count, first_from=world - 1),
    "gloo_after_named": from_anyone(gloo, count, first_from=world - 1),
}
# Sends counted for any-source receives do not disturb receives that name
# their peer: a ring.
right, left = (rank + 1) % world, (rank - 1) % world
got = torch.empty(7, dtype=torch.int64)
if rank % 2 == 0:
    dist.send(torch.full((7,), rank), right, group=ours)
    dist.recv(got, left, group=ours)
else:
    dist.recv(got, left, group=ours)
    dist.send(torch.full((7,), rank), right, group=ours)
result["ring"] = got.tolist()
dist.barrier(group=gloo)  # the last receives done before any rank leaves
with open(out_path, "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
