"""One rank of the collective comparison: every covered collective on an
rcclrs group and on a gloo group over the same inputs, results compared
bitwise. Usage: _collectives.py RANK WORLD STORE OUT_JSON

Inputs are small integers (exactly representable in every datatype, with
sums and products that stay exact), so a reduction's result does not
depend on the order in which ranks are combined and gloo's result is the
exact answer. Where gloo lacks an operation (AVG, PREMUL_SUM) the expected
result is computed from gloo's SUM.
"""

import datetime
import json
import sys
import traceback

import torch
import torch.distributed as dist

import rcclrs

rank, world, store_path, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
R = dist.ReduceOp

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int64": torch.int64,
}
FLOATS = {"float32", "float64", "float16", "bfloat16"}
INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers (bitwise comparison; -0.0 != 0.0)."""
    if t.is_complex():
        t = torch.view_as_real(t)
    if t.dtype == torch.bool:
        return t
    return t.contiguous().view(INT_VIEW[t.element_size()])


def same(a, b, what=""):
    if isinstance(a, (list, tuple)):
        assert len(a) == len(b), f"{what}: {len(a)} vs {len(b)} tensors"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{what}[{i}]")
        return
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(bits(a), bits(b)), f"{what}: rcclrs {a} vs expected {b}"


def data(name: str, shape, seed: int, op=R.SUM, r: int = None) -> torch.Tensor:
    """Deterministic small-integer data of this (or rank r's) rank."""
    r = rank if r is None else r
    g = torch.Generator().manual_seed(seed * 1000 + r)
    dtype = DTYPES[name]
    signed = name != "uint8"
    if op == R.PRODUCT:
        choices = torch.tensor([1, 2, -1] if signed else [1, 2, 1])
        v = choices[torch.randint(0, 3, shape, generator=g)]
    else:
        lo = -8 if signed else 0
        v = torch.randint(lo, 9, shape, generator=g)
    return v.to(dtype)


rc = rcclrs  # keeps the import (it registers the backend)
store = dist.FileStore(store_path, world)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=60))
ours = dist.new_group(backend="rcclrs")
gloo = dist.new_group(backend="gloo")
assert isinstance(ours, rcclrs.ProcessGroupRccl), type(ours)

results = {}
seed = [0]


def case(name):
    def run(fn):
        seed[0] += 1
        try:
            fn(seed[0])
            results[name] = "ok"
        except Exception:  # noqa: BLE001 - reported per case
            results[name] = traceback.format_exc()
        return fn
    return run


def both(fn):
    """fn(group) on rcclrs and on gloo."""
    return fn(ours), fn(gloo)


N = 37  # elements: odd, so no path divides evenly

# ---- all_reduce: every dtype x op ------------------------------------------
for dname in DTYPES:
    for opname, op in (("SUM", R.SUM), ("PRODUCT", R.PRODUCT), ("MIN", R.MIN), ("MAX", R.MAX)):
        @case(f"all_reduce[{dname}-{opname}]")
        def _(s, dname=dname, op=op):
            x = data(dname, (N,), s, op)
            a, b = x.clone(), x.clone()
            dist.all_reduce(a, op=op, group=ours)
            dist.all_reduce(b, op=op, group=gloo)
            same(a, b)

    @case(f"all_reduce[{dname}-AVG]")
    def _(s, dname=dname):
        x = data(dname, (N,), s)
        a, total = x.clone(), x.clone()
        dist.all_reduce(a, op=R.AVG, group=ours)
        dist.all_reduce(total, op=R.SUM, group=gloo)
        if dname in FLOATS:
            expected = total / world  # exact: world is a power of two
        else:
            expected = torch.div(total, world, rounding_mode="trunc")  # C division, as NCCL
        same(a, expected.to(x.dtype))

    if dname in FLOATS:
        @case(f"all_reduce[{dname}-PREMUL_SUM]")
        def _(s, dname=dname):
            x = data(dname, (N,), s)
            a, b = x.clone(), x * 0.5
            dist.all_reduce(a, op=dist._make_nccl_premul_sum(0.5), group=ours)
            dist.all_reduce(b, op=R.SUM, group=gloo)
            same(a, b)


@case("all_reduce[float32-SUM-1MiB-async]")
def _(s):
    x = data("float32", (1 << 18,), s)
    a, b = x.clone(), x.clone()
    work = dist.all_reduce(a, group=ours, async_op=True)
    dist.all_reduce(b, group=gloo)
    assert work.wait() is True
    assert work.is_completed()
    value = work.get_future().wait()
    assert value[0] is a, "the future's value is the output tensor list"
    same(a, b)


@case("all_reduce[async-queue-order]")
def _(s):
    xs = [data("int64", (N,), s + i) for i in range(8)]
    works = [dist.all_reduce(x, group=ours, async_op=True) for x in xs]
    for w in works:
        w.wait()
    for i, x in enumerate(xs):
        ref = data("int64", (N,), s + i)
        dist.all_reduce(ref, group=gloo)
        same(x, ref, f"tensor {i}")


@case("all_reduce[non-contiguous]")
def _(s):
    x = data("float32", (6, 5), s).t()  # a transposed view
    assert not x.is_contiguous()
    a, b = x.clone().t().contiguous().t(), x.contiguous()
    assert not a.is_contiguous()
    dist.all_reduce(a, group=ours)
    dist.all_reduce(b, group=gloo)
    same(a.contiguous(), b)


@case("all_reduce[empty tensors]")
def _(s):
    a = torch.empty(0)
    dist.all_reduce(a, group=ours)
    out = torch.empty(0, 3)
    dist.all_to_all_single(out, torch.empty(0, 3), [0] * world, [0] * world, group=ours)
    dist.all_gather_into_tensor(torch.empty(0), torch.empty(0), group=ours)
    assert a.numel() == 0 and out.numel() == 0


@case("all_reduce[bool-SUM-is-OR]")
def _(s):
    x = data("int32", (N,), s) > 5
    a, b = x.clone(), x.to(torch.int32)
    dist.all_reduce(a, group=ours)
    dist.all_reduce(b, op=R.MAX, group=gloo)
    same(a, b.bool())


@case("all_reduce[complex64-SUM]")
def _(s):
    x = torch.complex(data("float32", (N,), s), data("float32", (N,), s + 100))
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=ours)
    dist.all_reduce(b, group=gloo)
    same(a, b)


# ---- broadcast, reduce ------------------------------------------------------
for dname in DTYPES:
    @case(f"broadcast[{dname}]")
    def _(s, dname=dname):
        root = world - 1
        x = data(dname, (N,), s)
        a, b = x.clone(), x.clone()
        dist.broadcast(a, src=root, group=ours)
        dist.broadcast(b, src=root, group=gloo)
        same(a, b)
        same(a, data(dname, (N,), s, r=root))

    for opname, op in (("SUM", R.SUM), ("MAX", R.MAX)):
        @case(f"reduce[{dname}-{opname}]")
        def _(s, dname=dname, op=op):
            root = 1
            x = data(dname, (N,), s)
            a, b = x.clone(), x.clone()
            dist.reduce(a, dst=root, op=op, group=ours)
            dist.reduce(b, dst=root, op=op, group=gloo)
            if rank == root:
                same(a, b)
            else:
                same(a, x, "a non-root's tensor is left as it was")


# ---- all_gather, all_gather_into_tensor ---------------------------------------
for dname in DTYPES:
    @case(f"all_gather[{dname}]")
    def _(s, dname=dname):
        x = data(dname, (3, 4), s)
        a = [torch.empty(3, 4, dtype=x.dtype) for _ in range(world)]
        b = [torch.empty(3, 4, dtype=x.dtype) for _ in range(world)]
        dist.all_gather(a, x, group=ours)
        dist.all_gather(b, x, group=gloo)
        same(a, b)

    @case(f"all_gather_into_tensor[{dname}]")
    def _(s, dname=dname):
        x = data(dname, (N,), s)
        a = torch.empty(world * N, dtype=x.dtype)
        b = torch.empty(world * N, dtype=x.dtype)
        dist.all_gather_into_tensor(a, x, group=ours)
        dist.all_gather_into_tensor(b, x, group=gloo)
        same(a, b)


@case("all_gather[non-contiguous outputs]")
def _(s):
    x = data("int32", (4, 3), s)
    a = [torch.empty(3, 4, dtype=torch.int32).t() for _ in range(world)]
    b = [torch.empty(4, 3, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(a, x, group=ours)
    dist.all_gather(b, x, group=gloo)
    same([t.contiguous() for t in a], b)


@case("all_gather_into_tensor[in-place, 2-D]")
def _(s):
    x = data("float32", (5, 2), s)
    a = torch.zeros(world * 5, 2)
    a[rank * 5:(rank + 1) * 5] = x
    b = torch.empty(world * 5, 2)
    dist.all_gather_into_tensor(a, a[rank * 5:(rank + 1) * 5], group=ours)
    dist.all_gather_into_tensor(b, x, group=gloo)
    same(a, b)


# ---- reduce_scatter_tensor, reduce_scatter ----------------------------------
for dname in DTYPES:
    for opname, op in (("SUM", R.SUM), ("MIN", R.MIN)):
        @case(f"reduce_scatter_tensor[{dname}-{opname}]")
        def _(s, dname=dname, op=op):
            x = data(dname, (world * N,), s)
            a = torch.empty(N, dtype=x.dtype)
            b = torch.empty(N, dtype=x.dtype)
            dist.reduce_scatter_tensor(a, x, op=op, group=ours)
            dist.reduce_scatter_tensor(b, x, op=op, group=gloo)
            same(a, b)


@case("reduce_scatter_tensor[float32-AVG]")
def _(s):
    x = data("float32", (world * N,), s)
    a, b = torch.empty(N), torch.empty(N)
    dist.reduce_scatter_tensor(a, x, op=R.AVG, group=ours)
    dist.reduce_scatter_tensor(b, x, op=R.SUM, group=gloo)
    same(a, b / world)


@case("reduce_scatter[list, int64]")
def _(s):
    xs = [data("int64", (2, 3), s + i) for i in range(world)]
    a, b = torch.empty(2, 3, dtype=torch.int64), torch.empty(2, 3, dtype=torch.int64)
    dist.reduce_scatter(a, xs, group=ours)
    dist.reduce_scatter(b, xs, group=gloo)
    same(a, b)


# ---- all_to_all_single, all_to_all ------------------------------------------
for dname in DTYPES:
    @case(f"all_to_all_single[{dname}-even]")
    def _(s, dname=dname):
        x = data(dname, (world * 3, 2), s)
        a, b = torch.empty_like(x), torch.empty_like(x)
        dist.all_to_all_single(a, x, group=ours)
        dist.all_to_all_single(b, x, group=gloo)
        same(a, b)


def split_sizes(src: int, dst: int) -> int:
    """Rows rank src sends to rank dst: uneven, some zero."""
    return (src * 3 + dst * 2) % 4


for dname in ("float32", "int8", "bfloat16"):
    @case(f"all_to_all_single[{dname}-uneven]")
    def _(s, dname=dname):
        send = [split_sizes(rank, d) for d in range(world)]
        recv = [split_sizes(src, rank) for src in range(world)]
        x = data(dname, (sum(send), 3), s)
        a = torch.full((sum(recv), 3), 99).to(x.dtype)
        b = torch.full((sum(recv), 3), 99).to(x.dtype)
        dist.all_to_all_single(a, x, recv, send, group=ours)
        dist.all_to_all_single(b, x, recv, send, group=gloo)
        same(a, b)


@case("all_to_all[list, float64]")
def _(s):
    xs = [data("float64", (2, 3), s + d) for d in range(world)]
    a = [torch.empty(2, 3, dtype=torch.float64) for _ in range(world)]
    b = [torch.empty(2, 3, dtype=torch.float64) for _ in range(world)]
    dist.all_to_all(a, xs, group=ours)
    dist.all_to_all(b, xs, group=gloo)
    same(a, b)


@case("all_to_all[list, uneven sizes]")
def _(s):
    # gloo needs equal sizes: the expected tensors are each sender's data.
    xs = [data("int32", (d + 1,), s + d) for d in range(world)]
    a = [torch.empty(rank + 1, dtype=torch.int32) for _ in range(world)]
    dist.all_to_all(a, xs, group=ours)
    same(a, [data("int32", (rank + 1,), s + rank, r=src) for src in range(world)])


# ---- gather, scatter -----------------------------------------------------------
@case("gather[int32]")
def _(s):
    root = world - 1
    x = data("int32", (N,), s)
    a = [torch.empty(N, dtype=torch.int32) for _ in range(world)] if rank == root else None
    b = [torch.empty(N, dtype=torch.int32) for _ in range(world)] if rank == root else None
    dist.gather(x, a, dst=root, group=ours)
    dist.gather(x, b, dst=root, group=gloo)
    if rank == root:
        same(a, b)


@case("scatter[float16]")
def _(s):
    root = 1
    xs = [data("float16", (N,), s + i) for i in range(world)] if rank == root else None
    a, b = torch.empty(N, dtype=torch.float16), torch.empty(N, dtype=torch.float16)
    dist.scatter(a, xs, src=root, group=ours)
    dist.scatter(b, xs, src=root, group=gloo)
    same(a, b)


# ---- send / recv -----------------------------------------------------------------
for dname in ("float32", "int64", "uint8"):
    @case(f"send_recv[{dname}]")
    def _(s, dname=dname):
        right, left = (rank + 1) % world, (rank - 1) % world
        x = data(dname, (N,), s)

        def ring(g):
            got = torch.empty_like(x)
            if rank % 2 == 0:
                dist.send(x, right, group=g)
                dist.recv(got, left, group=g)
            else:
                dist.recv(got, left, group=g)
                dist.send(x, right, group=g)
            return got
        a, b = both(ring)
        same(a, b)
        same(a, data(dname, (N,), s, r=left))


@case("isend_irecv[async handles]")
def _(s):
    right, left = (rank + 1) % world, (rank - 1) % world
    x = data("int32", (N,), s)
    got = torch.empty_like(x)
    if rank % 2 == 0:
        works = [dist.isend(x, right, group=ours), dist.irecv(got, left, group=ours)]
    else:
        works = [dist.irecv(got, left, group=ours), dist.isend(x, right, group=ours)]
    for w in works:
        w.wait()
    same(got, data("int32", (N,), s, r=left))


@case("batch_isend_irecv[ring, 8 MiB, one group]")
def _(s):
    # Everyone sends before receiving: without NCCL grouping this would wait
    # forever on messages larger than the connection buffers.
    right, left = (rank + 1) % world, (rank - 1) % world
    x = data("float32", (1 << 21,), s)
    a = torch.empty_like(x)
    ops = [dist.P2POp(dist.isend, x, right, group=ours), dist.P2POp(dist.irecv, a, left, group=ours)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    same(a, data("float32", (1 << 21,), s, r=left))


@case("barrier")
def _(s):
    dist.barrier(group=ours)
    assert dist.barrier(group=ours, async_op=True).wait()


# ---- functional collectives (what DTensor and FSDP2 use) -------------------------
@case("functional[all_reduce, all_gather_tensor, reduce_scatter_tensor, all_to_all_single]")
def _(s):
    import torch.distributed._functional_collectives as fc

    x = data("float32", (world * 4,), s)
    ref = x.clone()
    dist.all_reduce(ref, group=gloo)
    same(fc.all_reduce(x, "sum", ours).wait(), ref, "all_reduce")
    ref = torch.empty(world * world * 4)
    dist.all_gather_into_tensor(ref, x, group=gloo)
    same(fc.all_gather_tensor(x, 0, ours).wait(), ref, "all_gather_tensor")
    ref = torch.empty(4)
    dist.reduce_scatter_tensor(ref, x, group=gloo)
    same(fc.reduce_scatter_tensor(x, "sum", 0, ours).wait(), ref, "reduce_scatter_tensor")
    ref = torch.empty_like(x)
    dist.all_to_all_single(ref, x, group=gloo)
    same(fc.all_to_all_single(x, None, None, ours).wait(), ref, "all_to_all_single")


# ---- coalesced calls: as many inputs as ranks, and another number --------------
# (torch lays all_gather_coalesced's outputs out as [rank][input]; with as
# many inputs as ranks a transposed layout would pass unnoticed by shape.)
IN_COUNTS = sorted({1, world, world + 1})


def inputs(k: int, s: int, dname="float32"):
    """k tensors of different shapes (tensor i has i + 2 rows)."""
    return [data(dname, (i + 2, 3), s + i) for i in range(k)]


for k in IN_COUNTS:
    @case(f"coalesced[all_gather_coalesced-{k}-inputs]")
    def _(s, k=k):
        xs = inputs(k, s)
        a = [[torch.empty_like(x) for x in xs] for _ in range(world)]
        b = [[torch.empty_like(x) for x in xs] for _ in range(world)]
        dist.all_gather_coalesced(a, xs, group=ours)
        dist.all_gather_coalesced(b, xs, group=gloo)
        same(a, b)
        for r in range(world):
            same(a[r], inputs(k, s) if r == rank else [data("float32", (i + 2, 3), s + i, r=r) for i in range(k)],
                 f"rank {r}'s inputs")

    @case(f"coalesced[all_gather_coalesced-{k}-inputs-async]")
    def _(s, k=k):
        xs = inputs(k, s, "int64")
        a = [[torch.empty_like(x) for x in xs] for _ in range(world)]
        b = [[torch.empty_like(x) for x in xs] for _ in range(world)]
        dist.all_gather_coalesced(a, xs, group=ours, async_op=True).wait()
        dist.all_gather_coalesced(b, xs, group=gloo)
        same(a, b)

    @case(f"coalesced[all_reduce_coalesced-{k}-inputs]")
    def _(s, k=k):
        xs = inputs(k, s)
        a, b = [x.clone() for x in xs], [x.clone() for x in xs]
        dist.all_reduce_coalesced(a, group=ours)
        dist.all_reduce_coalesced(b, group=gloo)
        same(a, b)

    @case(f"coalesced[coalescing_manager-all_reduce-{k}-inputs]")
    def _(s, k=k):
        xs = inputs(k, s, "int32")
        a, b = [x.clone() for x in xs], [x.clone() for x in xs]
        with dist._coalescing_manager(group=ours, async_ops=True) as cm:
            for x in a:
                dist.all_reduce(x, op=R.MAX, group=ours)
        cm.wait()
        for x in b:
            dist.all_reduce(x, op=R.MAX, group=gloo)
        same(a, b)

    @case(f"coalesced[allgather_into_tensor_coalesced-{k}-inputs]")
    def _(s, k=k):
        xs = inputs(k, s)
        a = [torch.empty(world * x.shape[0], 3) for x in xs]
        b = [torch.empty(world * x.shape[0], 3) for x in xs]
        with dist._coalescing_manager(group=ours, async_ops=True) as cm:
            for out, x in zip(a, xs):
                dist.all_gather_into_tensor(out, x, group=ours)
        cm.wait()
        for out, x in zip(b, xs):
            dist.all_gather_into_tensor(out, x, group=gloo)
        same(a, b)

    @case(f"coalesced[reduce_scatter_tensor_coalesced-{k}-inputs]")
    def _(s, k=k):
        xs = [data("float64", (world * (i + 1), 2), s + i) for i in range(k)]
        a = [torch.empty(i + 1, 2, dtype=torch.float64) for i in range(k)]
        b = [torch.empty(i + 1, 2, dtype=torch.float64) for i in range(k)]
        with dist._coalescing_manager(group=ours, async_ops=True) as cm:
            for out, x in zip(a, xs):
                dist.reduce_scatter_tensor(out, x, group=ours)
        cm.wait()
        for out, x in zip(b, xs):
            dist.reduce_scatter_tensor(out, x, group=gloo)
        same(a, b)

    @case(f"coalesced[functional-{k}-inputs]")
    def _(s, k=k):
        import torch.distributed._functional_collectives as fc

        xs = [data("float32", (world * (i + 1),), s + i) for i in range(k)]
        refs = [x.clone() for x in xs]
        for ref in refs:
            dist.all_reduce(ref, group=gloo)
        same([t.wait() for t in fc.all_reduce_coalesced(xs, "sum", ours)], refs, "all_reduce_coalesced")
        refs = [torch.empty(world * x.numel()) for x in xs]
        for ref, x in zip(refs, xs):
            dist.all_gather_into_tensor(ref, x, group=gloo)
        same([t.wait() for t in fc.all_gather_into_tensor_coalesced(xs, ours)], refs,
             "all_gather_into_tensor_coalesced")
        refs = [torch.empty(i + 1) for i in range(k)]
        for ref, x in zip(refs, xs):
            dist.reduce_scatter_tensor(ref, x, group=gloo)
        same([t.wait() for t in fc.reduce_scatter_tensor_coalesced(xs, "sum", [0] * k, ours)], refs,
             "reduce_scatter_tensor_coalesced")


@case("coalesced[all_gather_coalesced-as-many-inputs-as-ranks-same-shape]")
def _(s):
    # The shapes cannot tell [rank][input] from [input][rank] here.
    xs = [data("int32", (4,), s + i) for i in range(world)]
    a = [[torch.empty(4, dtype=torch.int32) for _ in xs] for _ in range(world)]
    b = [[torch.empty(4, dtype=torch.int32) for _ in xs] for _ in range(world)]
    dist.all_gather_coalesced(a, xs, group=ours)
    dist.all_gather_coalesced(b, xs, group=gloo)
    same(a, b)


@case("coalesced[all_gather_coalesced-with-empty]")
def _(s):
    xs = [data("float32", (3,), s), torch.empty(0), data("float32", (2, 2), s + 1)]
    a = [[torch.empty_like(x) for x in xs] for _ in range(world)]
    b = [[torch.empty_like(x) for x in xs] for _ in range(world)]
    dist.all_gather_coalesced(a, xs, group=ours)
    dist.all_gather_coalesced(b, xs, group=gloo)
    same(a, b)


# ---- sparse all_reduce --------------------------------------------------------------
def sparse(s: int, sparse_dims: int, dense: tuple, nnz: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(s * 1000 + rank)
    shape = (4,) * sparse_dims + dense
    indices = torch.randint(0, 4, (sparse_dims, nnz), generator=g)  # duplicates too
    values = torch.randint(-8, 9, (nnz,) + dense, generator=g).to(dtype)
    return torch.sparse_coo_tensor(indices, values, shape)


for sparse_dims, dense in ((1, ()), (2, ()), (3, ()), (1, (2,)), (2, (3, 2))):
    @case(f"sparse[all_reduce-{sparse_dims}-sparse-dims-dense{list(dense)}]")
    def _(s, sparse_dims=sparse_dims, dense=dense):
        x = sparse(s, sparse_dims, dense, nnz=rank + 3)  # a different count on each rank
        a, b = x.clone(), x.clone()
        dist.all_reduce(a, group=ours)
        dist.all_reduce(b, group=gloo)
        assert a.is_coalesced() == b.is_coalesced()
        same(a.indices(), b.indices(), "indices")
        same(a.values(), b.values(), "values")
        same(a.to_dense(), b.to_dense(), "dense")


@case("sparse[all_reduce-float64-empty-on-rank-0-async]")
def _(s):
    x = sparse(s, 2, (), nnz=0 if rank == 0 else 4, dtype=torch.float64)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, group=ours, async_op=True).wait()
    dist.all_reduce(b, group=gloo)
    same(a.indices(), b.indices(), "indices")
    same(a.values(), b.values(), "values")


# ---- monitored_barrier --------------------------------------------------------------
def raises(fn, words):
    try:
        fn()
    except RuntimeError as e:
        assert all(w in str(e) for w in words), f"{words} not in: {e}"
        return
    raise AssertionError(f"nothing raised (expected {words})")


@case("monitored_barrier[passes, then names the missing ranks]")
def _(s):
    t = datetime.timedelta(seconds=30)
    dist.monitored_barrier(ours, timeout=t)
    dist.monitored_barrier(ours, timeout=t, wait_all_ranks=True)
    # No time at all: rank 0 gives up at once and tells the others.
    if rank == 0:
        raises(lambda: dist.monitored_barrier(ours, timeout=datetime.timedelta(0)),
               ["Rank 0 timed out in monitoredBarrier"])
    else:
        raises(lambda: dist.monitored_barrier(ours, timeout=datetime.timedelta(0)),
               [f"Rank {rank} successfully reached monitoredBarrier", "from rank 0"])
    dist.monitored_barrier(ours, timeout=t)  # usable after a failed one
    x = torch.ones(3)
    dist.all_reduce(x, group=ours)
    same(x, torch.full((3,), float(world)))
    # The last rank stays away (from here on its count of monitored
    # barriers is behind: this stays the family's last case).
    short = datetime.timedelta(seconds=0.5)
    if rank == 0:
        raises(lambda: dist.monitored_barrier(ours, timeout=short),
               [f"Rank {world - 1} failed to pass monitoredBarrier in 500 ms"])
    elif rank != world - 1:
        raises(lambda: dist.monitored_barrier(ours, timeout=short), [f"Rank {rank} successfully reached"])
    dist.barrier(group=gloo)


# ---- refused input: clear errors --------------------------------------------------
def refused(fn, exc, words):
    try:
        fn()
    except exc as e:
        for w in words:
            assert w in str(e), f"{w!r} not in the message: {e}"
        return
    raise AssertionError(f"no {exc.__name__} raised")


@case("errors[clear messages]")
def _(s):
    refused(lambda: dist.all_reduce(torch.ones(3), op=R.BAND, group=ours), ValueError, ["BAND", "not supported"])
    refused(lambda: dist.all_reduce(torch.ones(3, dtype=torch.int16), group=ours), TypeError,
            ["int16", "no NCCL datatype"])
    refused(lambda: dist.all_to_all_single(torch.empty(4), torch.empty(4), [1] * world, [3] * world, group=ours),
            ValueError, ["split_sizes"])
    refused(lambda: dist.all_gather_into_tensor(torch.empty(3), torch.empty(2), group=ours), ValueError,
            ["all_gather_into_tensor output"])
    refused(lambda: dist.all_gather_coalesced([[torch.empty(1)] * world] * (world + 1), [torch.ones(1)], group=ours),
            ValueError, [f"{world} output lists (one per rank)"])
    refused(lambda: dist.all_reduce(torch.ones(2).to_sparse(), op=R.MAX, group=ours), ValueError,
            ["sparse all_reduce sums"])
    # the group still works after refused calls
    x = torch.ones(3)
    dist.all_reduce(x, group=ours)
    same(x, torch.full((3,), float(world)))


with open(out_path, "w") as f:
    json.dump(results, f)
dist.destroy_process_group()
