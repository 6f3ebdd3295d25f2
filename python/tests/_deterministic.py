"""One rank of the deterministic training test. Usage:
_deterministic.py RANK WORLD STORE OUT_JSON

A few SGD steps of a small model, every rank on its own data of mixed
magnitudes, gradients summed over an rcclrs group one parameter at a time
(sizes below and above the board, so both of the mode's schedules run),
and once as a ZeRO-style reduce_scatter_tensor. Writes the final
parameters' hash and whether the first step's sums equal the documented
reference order (rccl::deterministic::reference), computed here from
every rank's gradients gathered over gloo.
"""

import datetime
import hashlib
import json
import sys

import torch
import torch.distributed as dist

import rcclrs

rank, world, store_path, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
ours = dist.new_group(backend="rcclrs")
assert isinstance(ours, rcclrs.ProcessGroupRccl), type(ours)
torch.use_deterministic_algorithms(True)


def split_even(count: int, parts: int):
    """(offset, length) of each of `parts` blocks of `count` elements, the
    first `count % parts` one longer (the all-reduce's owners)."""
    base, extra = divmod(count, parts)
    return [(i * base + min(i, extra), base + (i < extra)) for i in range(parts)]


def fold(inputs, first: int) -> torch.Tensor:
    """The reference order of a sum: rank first+1's input, then + first+2's,
    ..., + first's (ranks modulo the world), in float32."""
    acc = inputs[(first + 1) % world].clone()
    for k in range(2, world + 1):
        acc = acc + inputs[(first + k) % world]
    return acc


def all_reduce_reference(inputs) -> torch.Tensor:
    out = torch.empty_like(inputs[0])
    for owner, (offset, length) in enumerate(split_even(inputs[0].numel(), world)):
        out[offset:offset + length] = fold([x[offset:offset + length] for x in inputs], owner)
    return out


def gathered(t: torch.Tensor):
    parts = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(parts, t)
    return parts


torch.manual_seed(0)
# 600x32 weights: 75 KiB, over the board (the ordered ring); the rest fit it.
model = torch.nn.Sequential(torch.nn.Linear(32, 600), torch.nn.Tanh(), torch.nn.Linear(600, 16),
                            torch.nn.Tanh(), torch.nn.Linear(16, 1))
data = torch.Generator().manual_seed(1000 + rank)
# Inputs and targets whose magnitudes span 10^-4..10^4, and a scale per
# rank, so the gradients' sums round differently in another order.
x = torch.randn(64, 32, generator=data) * 10.0 ** torch.randint(-4, 5, (64, 32), generator=data)
y = torch.randn(64, 1, generator=data) * 10.0 ** (rank % 3)
scale = 10.0 ** (2 * (rank % 3) - 2)

matches_reference = []
sums = hashlib.sha256()
for step in range(3):
    model.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y) * scale
    loss.backward()
    for p in model.parameters():
        g = p.grad.reshape(-1)
        mine = gathered(g) if step == 0 else None
        dist.all_reduce(g, group=ours)
        sums.update(g.numpy().tobytes())
        if mine is not None:
            matches_reference.append(bool(torch.equal(g, all_reduce_reference(mine))))
    with torch.no_grad():
        for p in model.parameters():
            p -= 1e-3 * p.grad / p.grad.abs().max()

# The last step's gradients again, as ZeRO shards them: each rank gets the
# sum of its block, folded in the order that starts after it.
flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
flat = torch.cat([flat, flat.new_zeros(-flat.numel() % world)]) / 7.0
shard = flat.new_empty(flat.numel() // world)
dist.reduce_scatter_tensor(shard, flat, group=ours)
shards = [x.reshape(world, -1)[rank] for x in gathered(flat)]
shard_matches = bool(torch.equal(shard, fold(shards, rank)))

params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
result = {
    "params_sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
    "grads_sha256": sums.hexdigest(),
    "shard_sha256": hashlib.sha256(shard.numpy().tobytes()).hexdigest(),
    "grads_match_reference": matches_reference,
    "shard_matches_reference": shard_matches,
}
with open(out_path, "w") as f:
    json.dump(result, f)
dist.barrier()  # no rank tears its groups down while a peer still uses them
dist.destroy_process_group(ours)
dist.destroy_process_group()
