"""A small model trained with DistributedDataParallel on CPU tensors, on
rccl-rs (backend "rcclrs") or on gloo, with fixed seeds so that the two
runs can be compared:

    torchrun --nproc-per-node 4 examples/torch_ddp.py --backend rcclrs
    torchrun --nproc-per-node 4 examples/torch_ddp.py --backend gloo

With `--device cuda:0` the model and data live on the GPU (NCCL's backend,
"nccl", which rccl-rs serves when librcclrs.so is preloaded); the data and
the initial model are made on the CPU either way, so runs on both devices
start from the same numbers.

Every rank trains on its own shard of a synthetic regression problem; DDP
all-reduces the gradients (in several buckets, asynchronously, while the
backward pass runs). Rank 0 prints the mean loss over all ranks at every
step and the final one, also as a hex float for exact comparison.
"""

import argparse
import hashlib
import json
import pathlib
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import rcclrs  # noqa: F401 - registers the "rcclrs" backend
except ImportError:  # not installed: use the package in this repository
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
    import rcclrs  # noqa: F401


def params_digest(model: nn.Module) -> str:
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
    return hashlib.sha256(bytes(flat.view(torch.uint8).tolist())).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="rcclrs", help="rcclrs (default) or gloo")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32, help="samples per rank and step")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda:N")
    parser.add_argument("--json", help="rank 0 writes the losses and a digest of the parameters here")
    args = parser.parse_args()

    torch.set_num_threads(1)  # deterministic, and no oversubscription
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model everywhere (DDP checks)
    model = nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 1),
    )
    device = torch.device(args.device)
    model = model.to(device)
    # Small buckets: several all-reduces per step, overlapping the backward.
    ddp = DDP(model, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    # This rank's shard of y = sin(x . w) + noise.
    w = torch.randn(32, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(args.steps * args.batch, 32, generator=g)
    y = torch.sin(x @ w / 4).unsqueeze(1) + 0.05 * torch.randn(x.shape[0], 1, generator=g)
    x, y = x.to(device), y.to(device)

    losses = []
    start = time.perf_counter()
    for step in range(args.steps):
        xb = x[step * args.batch:(step + 1) * args.batch]
        yb = y[step * args.batch:(step + 1) * args.batch]
        loss = nn.functional.mse_loss(ddp(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        mean /= world
        losses.append(mean.item())
        if rank == 0 and (step % 10 == 0 or step == args.steps - 1):
            print(f"step {step:4d}  loss {mean.item():.6f}", flush=True)
    elapsed = time.perf_counter() - start

    digest = params_digest(model)
    if rank == 0:
        print(f"final loss {losses[-1]:.9f} ({losses[-1].hex()}) after {args.steps} steps "
              f"on {world} processes, backend {args.backend}; {elapsed:.2f} s; params sha256 {digest[:16]}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"losses": [v.hex() for v in losses], "params_hex": digest,
                           "backend": args.backend, "world": world, "seconds": elapsed}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
