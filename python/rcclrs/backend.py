"""The ``rcclrs`` torch.distributed backend: a Python ``ProcessGroup`` over
librcclrs' NCCL C API, for CPU tensors.

Each process group owns one communicator and one worker thread. Operations
run in the order they were issued: an asynchronous one (``async_op=True``,
and everything DistributedDataParallel issues) is queued to the worker and
returns a :class:`Work` at once; a synchronous one runs on the calling
thread when nothing is queued (saving the hand-off), else it is queued
behind the others and waited for. ctypes releases the GIL during every
library call, so Python threads (and torch's compute) run meanwhile.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import queue
import threading
import time
import traceback

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    Backend as _C10dBackend,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
)

from . import _nccl as nccl
from ._nccl import RcclError

BACKEND_NAME = "rcclrs"

# torch dtype -> ncclDataType_t
_DTYPES = {
    torch.int8: 0,
    torch.uint8: 1,
    torch.bool: 1,  # as NCCL's users do: bytes, with SUM -> MAX, PRODUCT -> MIN
    torch.int32: 2,
    torch.int64: 4,
    torch.float16: 6,
    torch.float32: 7,
    torch.float64: 8,
    torch.bfloat16: 9,
}
for _name, _code in (("uint32", 3), ("uint64", 5), ("float8_e4m3fn", 10), ("float8_e5m2", 11)):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _code

_R = dist.ReduceOp
_OPS = {_R.SUM: nccl.SUM, _R.PRODUCT: nccl.PROD, _R.MAX: nccl.MAX, _R.MIN: nccl.MIN, _R.AVG: nccl.AVG}
_BOOL_OPS = {_R.SUM: nccl.MAX, _R.PRODUCT: nccl.MIN, _R.MAX: nccl.MAX, _R.MIN: nccl.MIN,
             _R.BOR: nccl.MAX, _R.BAND: nccl.MIN}

# The group's timeout reaches the library as RCCL_TIMEOUT_MS; a value of
# the user's (any value this module did not write) wins.
_TIMEOUT_ENV = "RCCL_TIMEOUT_MS"
_written_timeout: str | None = None
# How long the send counts of any-source receives gather before they are
# published (see _SendCounts): the most an any-source receive can lag.
_PUBLISH_DELAY_S = 0.01
# torch's default for CPU groups, for a group created without a timeout.
_DEFAULT_TIMEOUT_S = 30 * 60.0
_env_lock = threading.Lock()


def _sent_key(src: int, dst: int) -> str:
    """The store key counting the messages rank src sent rank dst."""
    return f"rcclrs/sent/{src}/{dst}"


def _supported() -> str:
    return ", ".join(str(d).replace("torch.", "") for d in _DTYPES)


def _seconds(timeout) -> float | None:
    """A torch timeout (timedelta, seconds, None; zero or negative = none)."""
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    return float(timeout) if timeout > 0 else None


def _as_list(tensors):
    """ProcessGroup methods take a list of tensors; a lone tensor is one."""
    return [tensors] if isinstance(tensors, torch.Tensor) else tensors


class Work(dist._Work):
    """The handle of one operation (or of one coalesced batch).

    ``wait()`` blocks until it completed and raises its error if it failed;
    ``get_future()`` returns a ``torch.futures.Future`` completed with the
    output tensors (or with the error). A receive's ``_source_rank()`` is
    the rank it received from (what ``dist.recv(t)`` without ``src``
    returns).
    """

    def __init__(self, result):
        super().__init__()
        self._result = result
        self.source_rank: int | None = None
        self._future = torch.futures.Future()
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _complete(self, error: BaseException | None = None) -> None:
        self._error = error
        try:
            if error is None:
                self._future.set_result(self._result)
            else:
                self._future.set_exception(error)
        finally:
            # After the future, so that a returned wait() implies a
            # completed future.
            self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self):
        return self._error

    def wait(self, timeout=None) -> bool:
        limit = _seconds(timeout)
        if not self._done.wait(limit):
            raise RcclError(f"rcclrs: the operation did not complete within {limit} s")
        if self._error is not None:
            raise self._error
        return True

    def synchronize(self) -> None:
        self.wait()

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        return self._future

    def _source_rank(self) -> int:
        self.wait()
        if self.source_rank is None:
            raise RuntimeError("rcclrs: _source_rank() is only defined for a receive")
        return self.source_rank


class _Buf:
    """A tensor as the library sees it: a contiguous buffer (the tensor
    itself, or a contiguous copy written back after the operation)."""

    __slots__ = ("orig", "t", "ptr", "count", "dtype", "write_back")

    def __init__(self, t: torch.Tensor, output: bool):
        self.orig = t
        c = t if t.is_contiguous() else t.contiguous()
        self.t = c
        self.ptr = c.data_ptr() if c.numel() else None
        self.count = c.numel()
        self.dtype = _DTYPES[c.dtype]
        self.write_back = output and c is not t

    def finish(self) -> None:
        if self.write_back:
            with torch.no_grad():
                self.orig.detach().copy_(self.t)

    def at(self, elems: int):
        """The address `elems` elements in."""
        return self.t.data_ptr() + elems * self.t.element_size()


class _Call:
    """One library operation: `launch(ctx)` makes the calls (possibly
    inside an enclosing group), `finish()` runs after the group completed."""

    __slots__ = ("launch", "finish")

    def __init__(self, launch, finish=None):
        self.launch = launch
        self.finish = finish


class _Ctx:
    """What a launch needs: the communicator, and PreMulSum operators to
    destroy once the calls completed."""

    def __init__(self, comm):
        self.comm = comm
        self.premul_ops: list[int] = []

    def reduction(self, red, dtype_code: int) -> int:
        nccl_op, scalar = red
        if scalar is None:
            return nccl_op
        op = ctypes.c_int()
        nccl.check(
            nccl.lib().ncclRedOpCreatePreMulSum(
                ctypes.byref(op), scalar.data_ptr(), dtype_code, nccl.SCALAR_HOST_IMMEDIATE,
                self.comm),
            "ncclRedOpCreatePreMulSum", self.comm)
        self.premul_ops.append(op.value)
        return op.value

    def close(self) -> None:
        for op in self.premul_ops:
            nccl.lib().ncclRedOpDestroy(op, self.comm)
        self.premul_ops.clear()


class _SendCounts:
    """The messages this rank sent each peer, published in the group's
    store for any-source receives (see ProcessGroupRccl.send) by a thread
    of its own: a send only bumps a local count, and the thread, woken by
    the first send after a quiet spell, publishes every count that grew
    within _PUBLISH_DELAY_S of it in one go, so that a stream of sends
    costs a store update (and a thread switch) per interval, not per send."""

    def __init__(self, store, rank: int, size: int):
        self._store = store
        self._rank = rank
        self._sent = [0] * size
        self._published = [0] * size
        self._error: BaseException | None = None
        self._closed = False
        self._due = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None

    def add(self, peer: int) -> None:
        with self._changed:
            if self._error is not None:
                raise RcclError(f"rcclrs: publishing this rank's send counts in the store failed: {self._error}")
            self._sent[peer] += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._publish, name=f"rcclrs-sent-rank{self._rank}",
                                                daemon=True)
                self._thread.start()
            if not self._due:
                self._due = True
                self._changed.notify()

    def _publish(self) -> None:
        while True:
            with self._changed:
                while not self._closed and not self._due:
                    self._changed.wait()
                if self._closed:
                    return
            time.sleep(_PUBLISH_DELAY_S)
            with self._changed:
                self._due = False
                news = [(peer, n - p) for peer, (n, p) in enumerate(zip(self._sent, self._published)) if n > p]
                self._published = list(self._sent)
            try:
                for peer, n in news:
                    self._store.add(_sent_key(self._rank, peer), n)
            except Exception as err:  # noqa: BLE001 - reported by the next send
                with self._changed:
                    self._error = err
                return

    def close(self, wait: float) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join(wait)


class _DeviceBackend(_C10dBackend):
    """What ProcessGroupRccl registers for device type cpu (see there)."""

    def getBackendName(self) -> str:
        return BACKEND_NAME


class ProcessGroupRccl(dist.ProcessGroup):
    """A torch.distributed process group running on rccl-rs (CPU tensors)."""

    def __init__(self, store, rank: int, size: int, timeout=None):
        super().__init__(rank, size)
        # torch asks a group which devices it serves (_device_types: what
        # monitored_barrier and the object collectives look at) and for its
        # default backend (the flight recorder), and keeps the group's name
        # in its backends: a C++ group answers from the backends registered
        # on it, so one is, for device type cpu. Operations do not go
        # through it: torch calls this group's own methods.
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)
        self._device_backend = _DeviceBackend(rank, size)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self._device_backend)
        self._rank = rank
        self._size = size
        self._timeout = _seconds(timeout)
        self._comm = None
        self._failed: RcclError | None = None
        self._coalescing: list | None = None
        self._state_lock = threading.Lock()
        self._exec_lock = threading.Lock()
        self._pending = 0
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        # This group's store (torch prefixes it with the group's name):
        # any-source receives and monitored_barrier meet through it.
        self._store = store
        # Messages received from each rank, by the worker: with the
        # counts the senders publish, what an any-source receive can take.
        self._received = [0] * size
        self._send_counts = _SendCounts(store, rank, size)
        self._sent_keys_exist = False
        self._next_peer = 0
        self._monitored_barriers = 0
        self._comm = self._create_comm(store)
        self._worker = threading.Thread(
            target=self._serve, name=f"rcclrs-pg-rank{rank}", daemon=True)
        self._worker.start()

    # ---- creation and teardown --------------------------------------------

    def _create_comm(self, store):
        lib = nccl.lib()
        # The store is this group's (torch prefixes it with the group's
        # name). A name can come back (destroy_process_group, then a new
        # group over the same store): each creation round adds `size` to a
        # counter before anyone can start the next round (creation waits
        # for every rank), so the round number is the same on every rank
        # and an earlier round's id is never read.
        generation = (store.add("rcclrs/joined", 1) - 1) // self._size
        key = f"rcclrs/unique_id/{generation}"
        with _env_lock:
            self._apply_timeout()
            uid = nccl.UniqueId()
            if self._rank == 0:
                nccl.check(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
                store.set(key, bytes(uid))
            else:
                data = store.get(key)
                if len(data) != ctypes.sizeof(uid):
                    raise RcclError(
                        f"rcclrs: the store holds {len(data)} bytes under {key!r}, "
                        f"not a {ctypes.sizeof(uid)}-byte ncclUniqueId")
                uid = nccl.UniqueId.from_buffer_copy(data)
            comm = ctypes.c_void_p()
            nccl.check(lib.ncclCommInitRank(ctypes.byref(comm), self._size, uid, self._rank),
                       f"ncclCommInitRank (rank {self._rank} of {self._size})")
        return comm

    def _apply_timeout(self) -> None:
        """The communicator's waits are bounded by RCCL_TIMEOUT_MS, which
        the library reads when it creates a communicator: it is set to this
        group's timeout unless the user set it. It is only written when the
        value changes, so a program whose groups share one timeout writes
        it once, before any communicator exists (the library's threads read
        the environment too, and a write is not synchronized with them)."""
        global _written_timeout
        current = os.environ.get(_TIMEOUT_ENV)
        if self._timeout is None or (current is not None and current != _written_timeout):
            return
        ms = str(max(1, int(self._timeout * 1000)))
        if current != ms:
            os.environ[_TIMEOUT_ENV] = ms
            _written_timeout = ms

    def _stop_worker(self, wait: float | None) -> bool:
        if self._worker.is_alive():
            self._queue.put(None)
            self._worker.join(wait)
        self._send_counts.close(1.0)
        return not self._worker.is_alive()

    def shutdown(self) -> None:
        """Waits for queued operations (up to the timeout, else aborts) and
        destroys the communicator."""
        if self._comm is None:
            return
        if not self._stop_worker(self._timeout):
            self.abort()
            return
        comm, self._comm = self._comm, None
        nccl.check(nccl.lib().ncclCommDestroy(comm), "ncclCommDestroy")

    def abort(self) -> None:
        """Stops operations in flight (they fail) and frees the communicator."""
        if self._comm is None:
            return
        comm, self._comm = self._comm, None
        self._failed = self._failed or RcclError("rcclrs: the process group was aborted")
        nccl.lib().ncclCommAbort(comm)
        self._stop_worker(1.0)

    # ---- identity ----------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"ProcessGroupRccl(rank={self._rank}, size={self._size})"

    @property
    def supports_coalescing(self) -> bool:
        return True

    def _get_backend(self, device=None):
        # batch_isend_irecv asks the group's backend whether it coalesces;
        # this group is its own backend.
        return self

    # ---- execution ---------------------------------------------------------

    def _submit(self, calls: list[_Call], result, async_op: bool = True, work: Work | None = None) -> Work:
        work = work or Work(result)
        if self._coalescing is not None:
            self._coalescing.append((calls, work))
            return work
        self._check_usable()
        with self._state_lock:
            inline = not async_op and self._pending == 0
            if not inline:
                self._pending += 1
        if inline:
            work._complete(self._execute(calls))
        else:
            self._queue.put((calls, [work]))
        return work

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise RcclError(
                f"rcclrs: this process group cannot run more operations after an earlier "
                f"failure ({self._failed}); destroy it and create a new one",
                self._failed.code)
        if self._comm is None:
            raise RcclError("rcclrs: this process group was shut down")

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            calls, works = item
            error = self._execute(calls)
            with self._state_lock:
                self._pending -= 1
            for work in works:
                try:
                    work._complete(error)
                except Exception:  # noqa: BLE001 - a future's callback; the worker must go on
                    traceback.print_exc()

    def _execute(self, calls: list[_Call]) -> BaseException | None:
        lib = nccl.lib()
        with self._exec_lock:
            comm = self._comm
            if comm is None:
                return self._failed or RcclError("rcclrs: this process group was shut down")
            ctx = _Ctx(comm)
            try:
                if len(calls) == 1:
                    calls[0].launch(ctx)
                else:
                    nccl.check(lib.ncclGroupStart(), "ncclGroupStart")
                    try:
                        for call in calls:
                            call.launch(ctx)
                    finally:
                        code = lib.ncclGroupEnd()
                    nccl.check(code, "ncclGroupEnd")
                for call in calls:
                    if call.finish is not None:
                        call.finish()
                return None
            except RcclError as err:
                # A library failure other than refused arguments leaves the
                # communicator unusable; an error of this module's (no
                # code) leaves nothing posted.
                if err.code not in (None, nccl.INVALID_ARGUMENT):
                    self._failed = self._failed or err
                return err
            except BaseException as err:  # noqa: BLE001 - handed to the waiter
                return err
            finally:
                ctx.close()

    # ---- argument checks ----------------------------------------------------

    def _tensor(self, t, what: str) -> torch.Tensor:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rcclrs: {what} must be a torch.Tensor, not {type(t).__name__}")
        if t.device.type != "cpu":
            raise ValueError(
                f"rcclrs: {what} is on {t.device}; this backend takes CPU tensors "
                f"(GPU tensors: backend 'nccl' with librcclrs as libnccl.so.2, see the README)")
        if t.layout != torch.strided:
            raise ValueError(f"rcclrs: {what} has layout {t.layout}; only dense tensors are supported")
        if t.is_complex():
            t = torch.view_as_real(t)
        if t.dtype not in _DTYPES:
            raise TypeError(
                f"rcclrs: {what} has dtype {t.dtype}, which has no NCCL datatype "
                f"(supported: {_supported()})")
        return t

    def _buf(self, t, what: str, output: bool) -> _Buf:
        return _Buf(self._tensor(t, what), output)

    def _root(self, root: int, what: str) -> int:
        if not 0 <= root < self._size:
            raise ValueError(f"rcclrs: {what} {root} is out of range for {self._size} ranks")
        return root

    def _reduction(self, reduce_op, t: torch.Tensor, complex_input: bool):
        """(ncclRedOp_t, PreMulSum scalar tensor or None) for `reduce_op` on
        tensors like `t` (already real)."""
        op = getattr(reduce_op, "op", reduce_op)
        if complex_input and op not in (_R.SUM, _R.AVG):
            raise ValueError(f"rcclrs: {op} is not defined on complex tensors (SUM and AVG are)")
        if t.dtype == torch.bool:
            if op not in _BOOL_OPS:
                raise ValueError(f"rcclrs: {op} is not supported on bool tensors")
            return _BOOL_OPS[op], None
        if op == _R.PREMUL_SUM:
            factor = reduce_op.factor
            if isinstance(factor, torch.Tensor):
                factor = factor.item()
            return None, torch.tensor([factor], dtype=t.dtype)
        if op not in _OPS:
            raise ValueError(
                f"rcclrs: {op} is not supported: NCCL reduces with SUM, PRODUCT, MIN, MAX, "
                f"AVG and PREMUL_SUM (bitwise ops only on bool tensors)")
        return _OPS[op], None

    def _same(self, tensors, numel: int, dtype, what: str) -> None:
        for t in tensors:
            if t.numel() != numel or t.dtype != dtype:
                raise ValueError(
                    f"rcclrs: {what} must all have {numel} elements of {dtype}, got "
                    f"{t.numel()} of {t.dtype}")

    # ---- collectives ------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        tensors = _as_list(tensors)
        if opts is None or not hasattr(opts, "reduceOp"):
            # allreduce(tensors) or allreduce(tensors, op)
            reduce_op = _R.SUM if opts is None else opts
            opts = AllreduceOptions()
            opts.reduceOp = reduce_op
        if any(t.layout == torch.sparse_coo for t in tensors):
            calls = [self._sparse_allreduce_call(tensors, opts.reduceOp)]
        else:
            calls = [self._allreduce_call(t, opts.reduceOp) for t in tensors]
        return self._submit(calls, tensors, getattr(opts, "asyncOp", True))

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or AllreduceCoalescedOptions()
        calls = [self._allreduce_call(t, opts.reduceOp) for t in tensors]
        return self._submit(calls, tensors, getattr(opts, "asyncOp", True))

    def _allreduce_call(self, t, reduce_op) -> _Call:
        b = self._buf(t, "all_reduce tensor", output=True)
        red = self._reduction(reduce_op, b.t, t.is_complex())

        def launch(ctx):
            op = ctx.reduction(red, b.dtype)
            nccl.check(nccl.lib().ncclAllReduce(b.ptr, b.ptr, b.count, b.dtype, op, ctx.comm, None),
                       "ncclAllReduce", ctx.comm)
        return _Call(launch, b.finish)

    def _sparse_allreduce_call(self, tensors, reduce_op) -> _Call:
        """The sum of a sparse COO tensor over the ranks, as gloo computes
        it: every rank's indices and values, gathered (padded to the
        largest count), added up into one coalesced tensor that replaces
        the input. Its gathers run one after the other, alone."""
        if len(tensors) != 1 or tensors[0].layout != torch.sparse_coo:
            raise ValueError("rcclrs: a sparse all_reduce takes one sparse COO tensor")
        if self._coalescing is not None:
            raise ValueError("rcclrs: a sparse all_reduce cannot be coalesced with other operations")
        op = getattr(reduce_op, "op", reduce_op)
        if op != _R.SUM:
            raise ValueError(f"rcclrs: a sparse all_reduce sums; {op} is not supported")
        t = tensors[0]
        x = t.coalesce()
        values = self._tensor(x.values(), "sparse all_reduce values")  # checks the dtype
        n = self._size
        gathered = {}

        def all_gather(ctx, part: torch.Tensor) -> torch.Tensor:
            src = _Buf(part.contiguous(), output=False)
            out = torch.empty((n,) + tuple(part.shape), dtype=part.dtype)
            dst = _Buf(out, output=False)
            nccl.check(nccl.lib().ncclAllGather(src.ptr, dst.ptr, src.count, src.dtype, ctx.comm, None),
                       "ncclAllGather", ctx.comm)
            return out

        def launch(ctx):
            shape = [x._nnz(), x.sparse_dim(), x.dense_dim(), x.dim(), x.numel()]
            meta = all_gather(ctx, torch.tensor(shape, dtype=torch.int64))
            if not bool((meta[:, 1:] == meta[0, 1:]).all()):
                raise ValueError(
                    "rcclrs: sparse all_reduce tensors differ between ranks (sparse dims, dense "
                    f"dims, dims, elements per rank: {meta[:, 1:].tolist()})")
            counts = meta[:, 0].tolist()
            most = max(counts)
            indices = torch.zeros(most, x.sparse_dim(), dtype=torch.int64)
            indices[:x._nnz()] = x.indices().t()
            padded = torch.zeros((most,) + tuple(values.shape[1:]), dtype=values.dtype)
            padded[:x._nnz()] = values
            all_indices, all_values = all_gather(ctx, indices), all_gather(ctx, padded)
            gathered["indices"] = torch.cat([all_indices[r, :c] for r, c in enumerate(counts)]).t()
            gathered["values"] = torch.cat([all_values[r, :c] for r, c in enumerate(counts)])

        def finish():
            v = gathered["values"]
            if t.is_complex():
                v = torch.view_as_complex(v)
            total = torch.sparse_coo_tensor(gathered["indices"], v, x.shape).coalesce()
            with torch.no_grad():
                t.copy_(total)
        return _Call(launch, finish)

    def broadcast(self, tensors, opts=None):
        opts = opts or BroadcastOptions()
        tensors = _as_list(tensors)
        root = self._root(opts.rootRank, "broadcast root")
        bufs = [self._buf(t, "broadcast tensor", output=True) for t in tensors]

        def call(b):
            def launch(ctx):
                nccl.check(nccl.lib().ncclBroadcast(b.ptr, b.ptr, b.count, b.dtype, root, ctx.comm, None),
                           "ncclBroadcast", ctx.comm)
            return _Call(launch, b.finish)
        return self._submit([call(b) for b in bufs], tensors, getattr(opts, "asyncOp", True))

    def reduce(self, tensors, opts=None):
        opts = opts or ReduceOptions()
        root = self._root(opts.rootRank, "reduce root")

        def call(t):
            b = self._buf(t, "reduce tensor", output=True)
            red = self._reduction(opts.reduceOp, b.t, t.is_complex())

            def launch(ctx):
                op = ctx.reduction(red, b.dtype)
                nccl.check(nccl.lib().ncclReduce(b.ptr, b.ptr, b.count, b.dtype, op, root, ctx.comm, None),
                           "ncclReduce", ctx.comm)
            return _Call(launch, b.finish)
        return self._submit([call(t) for t in tensors], tensors, getattr(opts, "asyncOp", True))

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or AllgatherOptions()
        if len(output_tensors) != len(input_tensors):
            raise ValueError("rcclrs: allgather needs one output list per input tensor")
        calls = [self._allgather_list_call(outs, t) for outs, t in zip(output_tensors, input_tensors)]
        return self._submit(calls, output_tensors, getattr(opts, "asyncOp", True))

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """all_gather_coalesced: output_lists[r][i] receives rank r's
        input_tensors[i] (one list per rank, as torch lays them out)."""
        opts = opts or AllgatherOptions()
        n_in = len(input_tensors)
        if len(output_lists) != self._size or any(len(outs) != n_in for outs in output_lists):
            raise ValueError(
                f"rcclrs: all_gather_coalesced needs {self._size} output lists (one per rank) "
                f"of {n_in} tensors (one per input), got {[len(outs) for outs in output_lists]}")
        calls = [self._allgather_list_call([outs[i] for outs in output_lists], t)
                 for i, t in enumerate(input_tensors)]
        return self._submit(calls, output_lists, getattr(opts, "asyncOp", True))

    def _allgather_list_call(self, outs, t) -> _Call:
        src = self._buf(t, "all_gather input", output=False)
        if len(outs) != self._size:
            raise ValueError(f"rcclrs: all_gather needs {self._size} output tensors, got {len(outs)}")
        real_outs = [self._tensor(o, "all_gather output") for o in outs]
        self._same(real_outs, src.count, src.t.dtype, "all_gather outputs")
        gathered = torch.empty(self._size * src.count, dtype=src.t.dtype)
        dst = _Buf(gathered, output=False)

        def launch(ctx):
            nccl.check(nccl.lib().ncclAllGather(src.ptr, dst.ptr, src.count, src.dtype, ctx.comm, None),
                       "ncclAllGather", ctx.comm)

        def finish():
            with torch.no_grad():
                for i, o in enumerate(real_outs):
                    o.detach().copy_(gathered[i * src.count:(i + 1) * src.count].view(o.shape))
        return _Call(launch, finish)

    def all_gather_single(self, output, input, opts=None):
        opts = opts or AllgatherOptions()
        call = self._allgather_base_call(output, input)
        return self._submit([call], [output], getattr(opts, "asyncOp", True))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or AllgatherOptions()
        calls = [self._allgather_base_call(o, i) for o, i in zip(outputs, inputs)]
        return self._submit(calls, outputs, getattr(opts, "asyncOp", True))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _allgather_base_call(self, output, input) -> _Call:
        src = self._buf(input, "all_gather_into_tensor input", output=False)
        dst = self._buf(output, "all_gather_into_tensor output", output=True)
        if dst.count != self._size * src.count or dst.t.dtype != src.t.dtype:
            raise ValueError(
                f"rcclrs: all_gather_into_tensor output must hold {self._size} x {src.count} "
                f"elements of {src.t.dtype}, got {dst.count} of {dst.t.dtype}")

        def launch(ctx):
            nccl.check(nccl.lib().ncclAllGather(src.ptr, dst.ptr, src.count, src.dtype, ctx.comm, None),
                       "ncclAllGather", ctx.comm)
        return _Call(launch, dst.finish)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or GatherOptions()
        root = self._root(opts.rootRank, "gather root")
        if len(input_tensors) != 1:
            raise ValueError("rcclrs: gather takes one input tensor per process")
        src = self._buf(input_tensors[0], "gather input", output=False)
        outs = []
        gathered = None
        if self._rank == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self._size:
                raise ValueError(f"rcclrs: gather needs {self._size} output tensors on the root")
            outs = [self._tensor(o, "gather output") for o in output_tensors[0]]
            self._same(outs, src.count, src.t.dtype, "gather outputs")
            gathered = torch.empty(self._size * src.count, dtype=src.t.dtype)
        dst_ptr = gathered.data_ptr() if gathered is not None and gathered.numel() else None

        def launch(ctx):
            nccl.check(nccl.lib().ncclGather(src.ptr, dst_ptr, src.count, src.dtype, root, ctx.comm, None),
                       "ncclGather", ctx.comm)

        def finish():
            with torch.no_grad():
                for i, o in enumerate(outs):
                    o.detach().copy_(gathered[i * src.count:(i + 1) * src.count].view(o.shape))
        return self._submit([_Call(launch, finish)], output_tensors, getattr(opts, "asyncOp", True))

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or ScatterOptions()
        root = self._root(opts.rootRank, "scatter root")
        if len(output_tensors) != 1:
            raise ValueError("rcclrs: scatter takes one output tensor per process")
        dst = self._buf(output_tensors[0], "scatter output", output=True)
        packed = None  # the root's inputs, end to end
        if self._rank == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self._size:
                raise ValueError(f"rcclrs: scatter needs {self._size} input tensors on the root")
            ins = [self._tensor(t, "scatter input") for t in input_tensors[0]]
            self._same(ins, dst.count, dst.t.dtype, "scatter inputs")
            packed = torch.cat([t.reshape(-1) for t in ins])

        def launch(ctx):
            src_ptr = packed.data_ptr() if packed is not None and packed.numel() else None
            nccl.check(nccl.lib().ncclScatter(src_ptr, dst.ptr, dst.count, dst.dtype, root, ctx.comm, None),
                       "ncclScatter", ctx.comm)
        return self._submit([_Call(launch, dst.finish)], output_tensors, getattr(opts, "asyncOp", True))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or ReduceScatterOptions()
        if len(output_tensors) != 1 or len(input_tensors) != 1:
            raise ValueError("rcclrs: reduce_scatter takes one output tensor and one input list")
        out = output_tensors[0]
        dst = self._buf(out, "reduce_scatter output", output=True)
        ins = [self._tensor(t, "reduce_scatter input") for t in input_tensors[0]]
        if len(ins) != self._size:
            raise ValueError(f"rcclrs: reduce_scatter needs {self._size} input tensors, got {len(ins)}")
        self._same(ins, dst.count, dst.t.dtype, "reduce_scatter inputs")
        packed = torch.cat([t.reshape(-1) for t in ins])
        red = self._reduction(opts.reduceOp, dst.t, out.is_complex())
        src = _Buf(packed, output=False)
        return self._submit([self._reduce_scatter_call(dst, src, red)], output_tensors,
                            getattr(opts, "asyncOp", True))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or ReduceScatterOptions()
        call = self._reduce_scatter_base_call(output, input, opts.reduceOp)
        return self._submit([call], [output], getattr(opts, "asyncOp", True))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or ReduceScatterOptions()
        calls = [self._reduce_scatter_base_call(o, i, opts.reduceOp) for o, i in zip(outputs, inputs)]
        return self._submit(calls, outputs, getattr(opts, "asyncOp", True))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _reduce_scatter_base_call(self, output, input, reduce_op) -> _Call:
        dst = self._buf(output, "reduce_scatter_tensor output", output=True)
        src = self._buf(input, "reduce_scatter_tensor input", output=False)
        if src.count != self._size * dst.count or dst.t.dtype != src.t.dtype:
            raise ValueError(
                f"rcclrs: reduce_scatter_tensor input must hold {self._size} x {dst.count} "
                f"elements of {dst.t.dtype}, got {src.count} of {src.t.dtype}")
        red = self._reduction(reduce_op, dst.t, output.is_complex())
        return self._reduce_scatter_call(dst, src, red)

    def _reduce_scatter_call(self, dst: _Buf, src: _Buf, red) -> _Call:
        def launch(ctx):
            op = ctx.reduction(red, dst.dtype)
            nccl.check(nccl.lib().ncclReduceScatter(src.ptr, dst.ptr, dst.count, dst.dtype, op, ctx.comm, None),
                       "ncclReduceScatter", ctx.comm)
        return _Call(launch, dst.finish)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or AllToAllOptions()
        dst = self._buf(output, "all_to_all_single output", output=True)
        src = self._buf(input, "all_to_all_single input", output=False)
        if dst.t.dtype != src.t.dtype:
            raise ValueError(f"rcclrs: all_to_all_single dtypes differ: {dst.t.dtype} and {src.t.dtype}")
        n = self._size
        if not output_split_sizes and not input_split_sizes:
            if src.count != dst.count or src.count % n:
                raise ValueError(
                    f"rcclrs: all_to_all_single without split sizes needs input and output of "
                    f"equal size divisible by {n}, got {src.count} and {dst.count}")
            per = src.count // n

            def launch(ctx):
                nccl.check(nccl.lib().ncclAlltoAll(src.ptr, dst.ptr, per, src.dtype, ctx.comm, None),
                           "ncclAlltoAll", ctx.comm)
            return self._submit([_Call(launch, dst.finish)], [output], getattr(opts, "asyncOp", True))

        send = self._splits(src.t, input_split_sizes, "input")
        recv = self._splits(dst.t, output_split_sizes, "output")

        def launch(ctx):
            lib = nccl.lib()
            nccl.check(lib.ncclGroupStart(), "ncclGroupStart")
            try:
                for peer in range(n):
                    (s_off, s_cnt), (r_off, r_cnt) = send[peer], recv[peer]
                    if s_cnt:
                        nccl.check(lib.ncclSend(src.at(s_off), s_cnt, src.dtype, peer, ctx.comm, None),
                                   "ncclSend", ctx.comm)
                    if r_cnt:
                        nccl.check(lib.ncclRecv(dst.at(r_off), r_cnt, dst.dtype, peer, ctx.comm, None),
                                   "ncclRecv", ctx.comm)
            finally:
                code = lib.ncclGroupEnd()
            nccl.check(code, "ncclGroupEnd")
        return self._submit([_Call(launch, dst.finish)], [output], getattr(opts, "asyncOp", True))

    alltoall_base = all_to_all_single

    def _splits(self, t: torch.Tensor, sizes, what: str) -> list[tuple[int, int]]:
        """Per peer (element offset, element count) of dim-0 splits."""
        n = self._size
        rows = t.shape[0] if t.dim() else 1
        row = t.numel() // rows if rows else 0
        if not sizes:
            if rows % n:
                raise ValueError(
                    f"rcclrs: all_to_all_single {what} has {rows} rows, not divisible by {n} "
                    f"(give {what}_split_sizes)")
            sizes = [rows // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n or any(s < 0 for s in sizes) or sum(sizes) != rows:
            raise ValueError(
                f"rcclrs: all_to_all_single {what}_split_sizes {sizes} must be {n} non-negative "
                f"sizes adding up to the {rows} rows of the {what}")
        out, at = [], 0
        for s in sizes:
            out.append((at * row, s * row))
            at += s
        return out

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or AllToAllOptions()
        n = self._size
        if len(output_tensors) != n or len(input_tensors) != n:
            raise ValueError(f"rcclrs: all_to_all needs {n} input and {n} output tensors")
        outs = [self._buf(t, "all_to_all output", output=True) for t in output_tensors]
        ins = [self._buf(t, "all_to_all input", output=False) for t in input_tensors]
        for peer, (o, i) in enumerate(zip(outs, ins)):
            if o.t.dtype != i.t.dtype:
                raise ValueError(f"rcclrs: all_to_all dtypes differ for peer {peer}")

        def launch(ctx):
            lib = nccl.lib()
            nccl.check(lib.ncclGroupStart(), "ncclGroupStart")
            try:
                for peer in range(n):
                    if ins[peer].count:
                        nccl.check(lib.ncclSend(ins[peer].ptr, ins[peer].count, ins[peer].dtype, peer,
                                                ctx.comm, None), "ncclSend", ctx.comm)
                    if outs[peer].count:
                        nccl.check(lib.ncclRecv(outs[peer].ptr, outs[peer].count, outs[peer].dtype, peer,
                                                ctx.comm, None), "ncclRecv", ctx.comm)
            finally:
                code = lib.ncclGroupEnd()
            nccl.check(code, "ncclGroupEnd")

        def finish():
            for o in outs:
                o.finish()
        return self._submit([_Call(launch, finish)], output_tensors, getattr(opts, "asyncOp", True))

    # ---- point to point ----------------------------------------------------

    # Any-source receives: NCCL names the peer of every receive, so each
    # send counts the messages its rank sent the destination, and the
    # counts are published in this group's store ("rcclrs/sent/SRC/DST",
    # by _SendCounts' thread, soon after the send starts). A rank counts
    # the messages it took from each peer (self._received, in the order
    # its worker runs receives), so a peer whose published count is ahead
    # has a message no receive took yet: an any-source receive takes that
    # one.

    def send(self, tensors, dst: int, tag: int = 0):
        peer = self._root(dst, "send destination")
        bufs = [self._buf(t, "send tensor", output=False) for t in tensors]

        def call(b):
            def launch(ctx):
                # Before the send, which may wait for the receiver to post.
                self._send_counts.add(peer)
                nccl.check(nccl.lib().ncclSend(b.ptr, b.count, b.dtype, peer, ctx.comm, None),
                           "ncclSend", ctx.comm)
            return _Call(launch)
        return self._submit([call(b) for b in bufs], tensors)

    def recv(self, tensors, src: int, tag: int = 0):
        peer = self._root(src, "receive source")
        bufs = [self._buf(t, "recv tensor", output=True) for t in tensors]
        work = Work(tensors)
        work.source_rank = peer
        return self._submit([self._recv_call(b, lambda: peer) for b in bufs], tensors, work=work)

    def recv_anysource(self, tensors, tag: int = 0):
        """Receives one tensor from whichever rank sent this rank a message
        that no receive took yet (the work's _source_rank() says which),
        waiting up to the group's timeout for one to be sent."""
        if len(tensors) != 1:
            raise ValueError("rcclrs: a receive from any source takes one tensor")
        b = self._buf(tensors[0], "recv tensor", output=True)
        work = Work(tensors)

        def pick() -> int:
            work.source_rank = self._next_sender()
            return work.source_rank
        return self._submit([self._recv_call(b, pick)], tensors, work=work)

    recvAnysource = recv_anysource

    def _recv_call(self, b: _Buf, source) -> _Call:
        def launch(ctx):
            peer = source()
            self._received[peer] += 1
            nccl.check(nccl.lib().ncclRecv(b.ptr, b.count, b.dtype, peer, ctx.comm, None),
                       "ncclRecv", ctx.comm)
        return _Call(launch, b.finish)

    def _next_sender(self) -> int:
        """A rank that sent this rank a message no receive took yet (polling
        the store with a growing pause, up to the group's timeout); peers
        are tried in turn from the one after the last pick."""
        peers = [r for r in range(self._size) if r != self._rank]
        keys = [_sent_key(r, self._rank) for r in peers]
        if not self._sent_keys_exist:
            for k in keys:
                self._store.add(k, 0)  # multi_get waits for keys that do not exist
            self._sent_keys_exist = True
        limit = self._timeout if self._timeout is not None else _DEFAULT_TIMEOUT_S
        deadline = time.monotonic() + limit
        pause = 1e-4
        while True:
            sent = [int(v) for v in self._store.multi_get(keys)]
            for j in range(len(peers)):
                i = (self._next_peer + j) % len(peers)
                if sent[i] > self._received[peers[i]]:
                    self._next_peer = i + 1
                    return peers[i]
            if time.monotonic() >= deadline:
                raise RcclError(
                    f"rcclrs: receive from any source: Timed out waiting {int(limit * 1000)}ms "
                    f"for a message to rank {self._rank} from any of {self._size - 1} peers")
            time.sleep(pause)
            pause = min(2 * pause, 0.01)

    def barrier(self, opts=None):
        opts = opts or BarrierOptions()
        flag = torch.zeros(1, dtype=torch.int32)
        call = self._allreduce_call(flag, _R.SUM)
        return self._submit([call], [], getattr(opts, "asyncOp", True))

    def monitored_barrier(self, timeout=None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not reach it, as gloo's:
        rank 0 waits up to `timeout` for every other rank to arrive, then
        tells them whether all did; the others wait for that word up to
        the group's timeout. It meets through the store, so a failed one
        leaves the communicator usable."""
        if timeout is None:
            limit = self._timeout or _DEFAULT_TIMEOUT_S
        else:  # here 0 is no time at all
            limit = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        ms = int(limit * 1000)
        self._monitored_barriers += 1
        prefix = f"rcclrs/monitored_barrier/{self._monitored_barriers}"
        if self._rank != 0:
            self._store.set(f"{prefix}/arrived/{self._rank}", b"1")
            passed = self._store_wait(f"{prefix}/passed", self._timeout or _DEFAULT_TIMEOUT_S)
            if not passed or self._store.get(f"{prefix}/passed") != b"1":
                raise RcclError(
                    f"[Rank {self._rank}]: Rank {self._rank} successfully reached monitoredBarrier, but "
                    f"received errors while waiting for send/recv from rank 0. Please check rank 0 "
                    f"logs for faulty rank.")
            return
        start = time.monotonic()
        arrived, failed = [], []
        try:
            for r in range(1, self._size):
                # Without wait_all_ranks the ranks share the timeout (the
                # first one missing is reported); with it each gets all of
                # it, so that every missing one is found.
                remaining = limit if wait_all_ranks else start + limit - time.monotonic()
                if remaining <= 0:
                    raise RcclError(
                        f"[Rank 0]: Rank 0 timed out in monitoredBarrier after {ms} ms. Ranks that "
                        f"arrived: {arrived}; not yet waited for: {list(range(r, self._size))}")
                key = f"{prefix}/arrived/{r}"
                if self._store_wait(key, remaining):
                    arrived.append(r)
                    self._store.delete_key(key)
                elif wait_all_ranks:
                    failed.append(r)
                else:
                    raise RcclError(f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms")
            if failed:
                raise RcclError(
                    f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier "
                    f"in {ms} ms")
        except RcclError:
            self._store.set(f"{prefix}/passed", b"0")
            raise
        self._store.set(f"{prefix}/passed", b"1")

    def _store_wait(self, key: str, seconds: float) -> bool:
        """Whether `key` is in the store within `seconds` (now, for 0)."""
        if seconds > 0:
            try:
                self._store.wait([key], datetime.timedelta(seconds=seconds))
                return True
            except RuntimeError:
                pass  # timed out ("Wait timeout"): the check below has the last word
        return self._store.check([key])

    # ---- coalescing (batch_isend_irecv, _coalescing_manager) ----------------

    def start_coalescing(self, device=None) -> None:
        if self._coalescing is not None:
            raise RuntimeError("rcclrs: coalescing already started on this process group")
        self._coalescing = []

    _start_coalescing = start_coalescing

    def end_coalescing(self, device=None) -> Work:
        """Runs the operations issued since start_coalescing as one NCCL
        group (so matching sends and receives cannot deadlock)."""
        if self._coalescing is None:
            raise RuntimeError("rcclrs: end_coalescing without start_coalescing")
        batch, self._coalescing = self._coalescing, None
        calls = [c for cs, _ in batch for c in cs]
        works = [w for _, w in batch]
        group_work = Work([w._result for w in works])
        works.append(group_work)
        if not calls:
            for w in works:
                w._complete()
            return group_work
        self._check_usable()
        with self._state_lock:
            self._pending += 1
        self._queue.put((calls, works))
        return group_work

    _end_coalescing = end_coalescing


def create_process_group(store, rank: int, size: int, timeout) -> ProcessGroupRccl:
    """The creator torch.distributed calls for backend "rcclrs"."""
    return ProcessGroupRccl(store, rank, size, timeout)


def register() -> None:
    """Registers backend "rcclrs" (CPU tensors) with torch.distributed; done
    on `import rcclrs`, and by torch itself through the package's entry
    point when the package is installed."""
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, create_process_group, devices=["cpu"])
