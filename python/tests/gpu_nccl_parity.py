"""torch.distributed's collectives on one backend and device, each checked
against a reference computed here, and written out for a bitwise
comparison with another run:

    torchrun --nproc-per-node 2 gpu_nccl_parity.py --backend gloo --device cpu --out gloo.json
    LD_PRELOAD=librcclrs.so torchrun --nproc-per-node 2 gpu_nccl_parity.py \\
        --backend nccl --device cuda:0 --out nccl.json
    python gpu_nccl_parity.py --compare gloo.json nccl.json

Inputs are small integers, so every float sum is exact and results must be
the same bits on every backend. all_reduce (sum, avg, premul_sum),
broadcast, reduce, all_gather_into_tensor, reduce_scatter_tensor,
all_to_all_single, send / recv, barrier, a new_group, and (on CUDA) a
graph-captured all_reduce. Where a backend lacks an op (gloo: avg and
premul_sum), the same result is made from a sum, which the comparison
then checks the native op against. Several processes may share one GPU
(--device cuda:0 for all).
"""

import argparse
import json
import sys

import torch
import torch.distributed as dist

N = 24  # elements per rank's input (a multiple of every world size used)
DTYPES = {"int32": torch.int32, "float32": torch.float32, "bfloat16": torch.bfloat16}


def inputs(rank: int, dtype: torch.dtype, device) -> torch.Tensor:
    return ((torch.arange(N) * 3 + rank * 7) % 13).to(dtype).to(device)


def reference_sum(world: int, dtype) -> torch.Tensor:
    return sum(inputs(r, torch.int64, "cpu") for r in range(world)).to(dtype)


def run(args) -> dict:
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    native = args.backend == "nccl"
    out, bad = {}, []

    def record(name, got, want):
        got = got.detach().cpu()
        # Small integers: exact in float, whatever the type.
        out[name] = got.float().flatten().tolist()
        if not torch.equal(got, want.to(got.dtype)):
            bad.append(f"rank {rank}: {name}: got {got.flatten()[:8].tolist()}, want {want.flatten()[:8].tolist()}")

    for tname, dtype in DTYPES.items():
        total = reference_sum(world, torch.int64)
        x = inputs(rank, dtype, device)

        t = x.clone()
        dist.all_reduce(t)
        record(f"all_reduce.sum.{tname}", t, total)

        if dtype.is_floating_point:
            t = x.clone()
            if native:
                dist.all_reduce(t, op=dist.ReduceOp.AVG)
            else:
                dist.all_reduce(t)
                t /= world
            record(f"all_reduce.avg.{tname}", t, total.to(torch.float64) / world)

            t = x.clone()
            if native:
                dist.all_reduce(t, op=dist._make_nccl_premul_sum(2.0))
            else:
                t *= 2
                dist.all_reduce(t)
            record(f"all_reduce.premul_sum.{tname}", t, total * 2)

        t = x.clone()
        dist.broadcast(t, src=world - 1)
        record(f"broadcast.{tname}", t, inputs(world - 1, torch.int64, "cpu"))

        t = x.clone()
        dist.reduce(t, dst=0)
        if rank == 0:
            record(f"reduce.{tname}", t, total)

        gathered = torch.empty(world * N, dtype=dtype, device=device)
        dist.all_gather_into_tensor(gathered, x)
        record(f"all_gather_into_tensor.{tname}", gathered,
               torch.cat([inputs(r, torch.int64, "cpu") for r in range(world)]))

        scattered = torch.empty(N // world, dtype=dtype, device=device)
        dist.reduce_scatter_tensor(scattered, x)
        record(f"reduce_scatter_tensor.{tname}", scattered, total.chunk(world)[rank])

        exchanged = torch.empty_like(x)
        dist.all_to_all_single(exchanged, x)
        record(f"all_to_all_single.{tname}", exchanged,
               torch.cat([inputs(r, torch.int64, "cpu").chunk(world)[rank] for r in range(world)]))

    # send / recv around a ring, then a barrier.
    x = inputs(rank, torch.float32, device)
    got = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, (rank + 1) % world), dist.P2POp(dist.irecv, got, (rank - 1) % world)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    record("send_recv.float32", got, inputs((rank - 1) % world, torch.int64, "cpu"))
    dist.barrier()

    # A new group of every rank but the last (all of them if alone).
    members = list(range(max(1, world - 1)))
    group = dist.new_group(members)
    if rank in members:
        t = inputs(rank, torch.int32, device)
        dist.all_reduce(t, group=group)
        record("new_group.all_reduce.int32", t, sum(inputs(r, torch.int64, "cpu") for r in members))

    # One all_reduce captured in a CUDA graph, replayed twice.
    t = inputs(rank, torch.float32, device)
    if device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.all_reduce(t)  # warm-up outside the capture, as torch asks
        torch.cuda.current_stream().wait_stream(side)
        t.copy_(inputs(rank, torch.float32, device))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            dist.all_reduce(t)
        t.copy_(inputs(rank, torch.float32, device))
        graph.replay()
        torch.cuda.synchronize()
        record("graph.all_reduce.float32", t, reference_sum(world, torch.int64))
    else:
        dist.all_reduce(t)
        record("graph.all_reduce.float32", t, reference_sum(world, torch.int64))

    dist.destroy_process_group()
    if bad:
        print("\n".join(bad), file=sys.stderr)
    print(f"rank {rank}: {len(out)} results, {len(bad)} wrong ({args.backend} on {args.device})", flush=True)
    return {"rank": rank, "results": out, "wrong": len(bad)}


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.load(open(p)) for p in (a_path, b_path))
    differ = [name for name in a["results"] if a["results"][name] != b["results"].get(name)]
    missing = [name for name in a["results"] if name not in b["results"]]
    print(f"{len(a['results'])} results; {len(differ)} differ; {len(missing)} missing "
          f"({a_path} vs {b_path})")
    for name in differ[:10]:
        print(f"  differs: {name}")
    return 1 if differ or a["wrong"] or b["wrong"] else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", help="rank 0 writes its results here")
    parser.add_argument("--compare", nargs=2, metavar="JSON")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    result = run(args)
    if args.out and result["rank"] == 0:
        with open(args.out, "w") as f:
            json.dump(result, f)
    return 1 if result["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
