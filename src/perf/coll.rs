//! The collectives under test: their sizes, bandwidth factors, how to issue
//! them for one rank, and what each rank's buffers must hold.

use rccl::device::Stream;
use rccl::{CollCall, CollKind, Communicator, DataType, RedOp};

use super::args::{premul_scalar, TestOp};
use super::codec::{self, exact_int_limit};

/// One of the ten perf tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coll {
    /// `all_reduce_perf`
    AllReduce,
    /// `all_gather_perf`
    AllGather,
    /// `broadcast_perf`
    Broadcast,
    /// `reduce_perf`
    Reduce,
    /// `reduce_scatter_perf`
    ReduceScatter,
    /// `alltoall_perf`
    AllToAll,
    /// `gather_perf`
    Gather,
    /// `scatter_perf`
    Scatter,
    /// `sendrecv_perf`: each rank sends to rank+1 and receives from rank-1.
    SendRecv,
    /// `hypercube_perf`: an all-gather in log2(n) rounds of exchanges with
    /// rank ^ 2^k (power-of-two rank counts only).
    HyperCube,
}

/// Element counts of one call, as nccl-tests' `getCollByteCount`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Elements each rank sends.
    pub send: usize,
    /// Elements each rank receives.
    pub recv: usize,
    /// The count passed to the call.
    pub param: usize,
    /// In place, the send buffer is at recvbuff + rank * this.
    pub send_inplace_offset: usize,
    /// In place, the receive buffer is at recvbuff + rank * this.
    pub recv_inplace_offset: usize,
}

/// What one element of a rank's output must be.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Expect {
    /// Exactly these bytes (the type's encoding, low bytes used).
    Exact([u8; 8]),
    /// This value within a tolerance (floating-point averages).
    Approx(f64),
}

impl Coll {
    /// The binary's name, e.g. `all_reduce_perf`.
    pub fn program_name(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce_perf",
            Coll::AllGather => "all_gather_perf",
            Coll::Broadcast => "broadcast_perf",
            Coll::Reduce => "reduce_perf",
            Coll::ReduceScatter => "reduce_scatter_perf",
            Coll::AllToAll => "alltoall_perf",
            Coll::Gather => "gather_perf",
            Coll::Scatter => "scatter_perf",
            Coll::SendRecv => "sendrecv_perf",
            Coll::HyperCube => "hypercube_perf",
        }
    }

    /// Whether the test loops over reduction operators (-o).
    pub fn uses_op(self) -> bool {
        matches!(
            self,
            Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter | Coll::SendRecv
        )
    }

    /// Whether the collective reduces.
    pub fn reduces(self) -> bool {
        matches!(self, Coll::AllReduce | Coll::Reduce | Coll::ReduceScatter)
    }

    /// Whether the collective has a root (-r).
    pub fn has_root(self) -> bool {
        matches!(
            self,
            Coll::Broadcast | Coll::Reduce | Coll::Gather | Coll::Scatter
        )
    }

    /// The op name printed for a test that does not reduce.
    pub fn fixed_op_name(self) -> &'static str {
        match self {
            Coll::HyperCube => "",
            _ => "none",
        }
    }

    /// Counts for a call of `count` elements (`size / eltsize`) on `nranks`
    /// ranks; per-rank chunks are rounded down to 16 bytes, as nccl-tests.
    pub fn counts(self, count: usize, elt: usize, nranks: usize) -> Counts {
        let base = (count / nranks) & !(16 / elt - 1);
        let (send, recv, param, so, ro) = match self {
            Coll::AllReduce | Coll::Broadcast | Coll::Reduce | Coll::SendRecv => {
                (count, count, count, 0, 0)
            }
            Coll::AllGather | Coll::Gather | Coll::HyperCube => {
                (base, base * nranks, base, base, 0)
            }
            Coll::ReduceScatter | Coll::Scatter => (base * nranks, base, base, 0, base),
            Coll::AllToAll => (base * nranks, base * nranks, base, 0, 0),
        };
        Counts {
            send,
            recv,
            param,
            send_inplace_offset: so,
            recv_inplace_offset: ro,
        }
    }

    /// Algorithm and bus bandwidth in GB/s of a call with `count` (the param
    /// count) taking `sec` seconds, with nccl-tests' factors.
    pub fn bandwidth(self, count: usize, elt: usize, sec: f64, nranks: usize) -> (f64, f64) {
        let n = nranks as f64;
        let bytes = (count * elt) as f64;
        let (data, factor) = match self {
            Coll::AllReduce => (bytes, 2.0 * (n - 1.0) / n),
            Coll::Broadcast | Coll::Reduce | Coll::SendRecv => (bytes, 1.0),
            Coll::AllGather
            | Coll::ReduceScatter
            | Coll::AllToAll
            | Coll::Gather
            | Coll::Scatter => (bytes * n, (n - 1.0) / n),
            Coll::HyperCube => (bytes * (n - 1.0), 1.0),
        };
        let alg = data / 1.0e9 / sec;
        (alg, alg * factor)
    }

    /// Rounds of groups one call takes (hypercube: one per dimension).
    pub fn phases(self, nranks: usize) -> usize {
        match self {
            Coll::HyperCube => (nranks.max(2).trailing_zeros() as usize).max(1),
            _ => 1,
        }
    }

    /// Whether the test can run on `nranks` ranks (else a reason).
    pub fn supports(self, nranks: usize) -> Result<(), String> {
        if self == Coll::HyperCube && !nranks.is_power_of_two() {
            return Err(format!("nRanks {nranks} is not a power of 2, skipping"));
        }
        Ok(())
    }

    /// Issues phase `phase` of one call for `comm` (inside the caller's group
    /// when it drives several ranks); on device memory, ordered on
    /// `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must be valid for the counts of this call as
    /// [`Coll::counts`] lays them out (for the in-place forms, both inside
    /// one buffer), until the enclosing group ends or the call returns (on
    /// device memory: until the stream has run it).
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn issue(
        self,
        stream: Option<&dyn Stream>,
        comm: &Communicator,
        send: *const u8,
        recv: *mut u8,
        count: usize,
        dtype: DataType,
        op: RedOp,
        root: usize,
        phase: usize,
    ) -> rccl::Result<()> {
        let (rank, n) = (comm.rank(), comm.count());
        let raw = stream.map_or(0, |s| s.raw());
        let kind = match self {
            Coll::AllReduce => CollKind::AllReduce,
            Coll::AllGather => CollKind::AllGather,
            Coll::Broadcast => CollKind::Broadcast,
            Coll::Reduce => CollKind::Reduce,
            Coll::ReduceScatter => CollKind::ReduceScatter,
            Coll::AllToAll => CollKind::AllToAll,
            Coll::Gather => CollKind::Gather,
            Coll::Scatter => CollKind::Scatter,
            Coll::SendRecv => {
                rccl::group_start();
                // SAFETY: the caller guarantees `count` elements at both.
                let r = unsafe {
                    comm.send_raw_on_stream(send, count, dtype, (rank + 1) % n, raw)
                        .and_then(|()| {
                            comm.recv_raw_on_stream(recv, count, dtype, (rank + n - 1) % n, raw)
                        })
                };
                let end = rccl::group_end();
                return r.and(end);
            }
            Coll::HyperCube => {
                let chunk = count * dtype.size();
                if phase == 0 {
                    // SAFETY: recv holds n chunks; send holds one.
                    let own = unsafe { recv.add(rank * chunk) };
                    if !std::ptr::eq(own, send) && chunk > 0 {
                        match stream {
                            // SAFETY: both ranges stay valid until the
                            // stream has run the copy (the caller's
                            // contract); they do not overlap.
                            Some(stream) => unsafe { stream.copy_async(own, send, chunk) }?,
                            // SAFETY: both ranges are valid; they do not
                            // overlap (in place they are the same range,
                            // skipped above).
                            None => unsafe { std::ptr::copy_nonoverlapping(send, own, chunk) },
                        }
                    }
                }
                if n < 2 {
                    return Ok(());
                }
                let mask = 1usize << phase;
                let s = rank & !(mask - 1);
                let r = s ^ mask;
                rccl::group_start();
                // SAFETY: s and r are multiples of mask below n, so both
                // ranges of mask chunks lie inside recv's n chunks.
                let res = unsafe {
                    comm.send_raw_on_stream(
                        recv.add(s * chunk),
                        count * mask,
                        dtype,
                        rank ^ mask,
                        raw,
                    )
                    .and_then(|()| {
                        let into = recv.add(r * chunk);
                        comm.recv_raw_on_stream(into, count * mask, dtype, rank ^ mask, raw)
                    })
                };
                let end = rccl::group_end();
                return res.and(end);
            }
        };
        // SAFETY: forwarded from the caller.
        unsafe {
            comm.collective_raw_on_stream(
                CollCall {
                    kind,
                    count,
                    dtype,
                    op,
                    root,
                },
                send,
                recv,
                raw,
            )
        }
    }

    /// Whether the in-place run's output is checked. Send/receive and
    /// all-to-all have no in-place form (in NCCL nor in rccl-rs: the
    /// schedules may overwrite a block before sending it), so, as
    /// nccl-tests does for sendrecv, their in-place column is timed but
    /// reported as N/A.
    pub fn checks_in_place(self) -> bool {
        !matches!(self, Coll::SendRecv | Coll::AllToAll)
    }

    /// Whether `rank` sends data (its send region is filled).
    pub fn sends(self, rank: usize, root: usize) -> bool {
        !matches!(self, Coll::Broadcast | Coll::Scatter) || rank == root
    }

    /// Whether `rank`'s output is checked.
    pub fn receives(self, rank: usize, root: usize) -> bool {
        !matches!(self, Coll::Reduce | Coll::Gather) || rank == root
    }

    /// Value of element `j` of `rank`'s send buffer.
    pub fn input(self, pat: &Pattern, rank: usize, j: usize) -> f64 {
        pat.value(rank, j)
    }

    /// What element `j` of `rank`'s receive buffer must hold, for calls of
    /// param count `base`.
    pub fn expected(
        self,
        pat: &Pattern,
        rank: usize,
        root: usize,
        base: usize,
        j: usize,
    ) -> Expect {
        let n = pat.nranks;
        match self {
            Coll::AllReduce | Coll::Reduce => pat.reduce(j),
            Coll::ReduceScatter => pat.reduce(rank * base + j),
            Coll::Broadcast => pat.exact(pat.value(root, j)),
            Coll::AllGather | Coll::Gather | Coll::HyperCube => {
                pat.exact(pat.value(j / base, j % base))
            }
            Coll::AllToAll => pat.exact(pat.value(j / base, rank * base + j % base)),
            Coll::Scatter => pat.exact(pat.value(root, rank * base + j)),
            Coll::SendRecv => pat.exact(pat.value((rank + n - 1) % n, j)),
        }
    }
}

/// Deterministic per-rank data, chosen so that every reduction of it is
/// exact in the element type (small integers, powers of two), except
/// floating-point averages.
#[derive(Clone, Debug)]
pub struct Pattern {
    dtype: DataType,
    op: Option<TestOp>,
    nranks: usize,
    seed: usize,
    signed: bool,
    is_float: bool,
    /// Largest magnitude of a generated value.
    m: i64,
    /// For floating-point products: most factors of two in one element.
    pmax: usize,
}

impl Pattern {
    /// The data of one check for `op` (None: a data-movement collective).
    pub fn new(dtype: DataType, op: Option<TestOp>, nranks: usize, seed: usize) -> Pattern {
        let limit = exact_int_limit(dtype);
        let n = nranks as i64;
        let signed = !matches!(dtype, DataType::Uint8 | DataType::Uint32 | DataType::Uint64);
        let m = match op {
            Some(TestOp::Sum) => limit / n,
            Some(TestOp::MulSum) => limit / (2 * n),
            Some(TestOp::Avg) => limit / (n + 1),
            _ => limit.min(100),
        };
        let pmax = match dtype {
            DataType::Float8e4m3 => 8,
            DataType::Float8e5m2 | DataType::Float16 => 15,
            _ => 60,
        };
        Pattern {
            dtype,
            op,
            nranks,
            seed,
            signed,
            is_float: dtype.is_float(),
            m,
            pmax,
        }
    }

    fn h(&self, idx: usize) -> usize {
        idx.wrapping_add(self.seed.wrapping_mul(7919))
    }

    /// Value at `idx` of `rank`'s data.
    pub fn value(&self, rank: usize, idx: usize) -> f64 {
        let h = self.h(idx);
        let n = self.nranks;
        let m = self.m as usize;
        match self.op {
            Some(TestOp::Prod) if self.is_float => {
                let c = h % (n.min(self.pmax) + 1);
                if (rank + h) % n < c {
                    2.0
                } else {
                    1.0
                }
            }
            Some(TestOp::Prod) => (1 + (h + rank) % 3) as f64,
            Some(TestOp::Avg) if m >= 2 => {
                // a + d with the d's summing to zero over the ranks, so the
                // sum is n * a and the average exactly a.
                let a = 1 + (h.wrapping_mul(5)) % (m - 1);
                let d = if n < 2 {
                    0
                } else if rank == h % n {
                    1
                } else if rank == (h + 1) % n {
                    -1
                } else {
                    0
                };
                (a as i64 + d) as f64
            }
            Some(TestOp::Sum | TestOp::MulSum | TestOp::Avg)
                if m < 1 || (self.op == Some(TestOp::Avg)) =>
            {
                // Too many ranks for small values: one rank holds a 1.
                if rank == h % n {
                    1.0
                } else {
                    0.0
                }
            }
            _ => {
                let k = h.wrapping_mul(7).wrapping_add(rank.wrapping_mul(13));
                if self.signed {
                    ((k % (2 * m + 1)) as i64 - m as i64) as f64
                } else {
                    (k % (m + 1)) as f64
                }
            }
        }
    }

    fn exact(&self, v: f64) -> Expect {
        let mut b = [0u8; 8];
        codec::encode(self.dtype, v, &mut b);
        Expect::Exact(b)
    }

    /// The reduction over every rank of the data at `idx`.
    pub fn reduce(&self, idx: usize) -> Expect {
        let op = self.op.unwrap_or(TestOp::Sum);
        let n = self.nranks;
        if self.is_float {
            let vals = (0..n).map(|r| self.value(r, idx));
            let v = match op {
                TestOp::Sum | TestOp::Avg => vals.sum::<f64>(),
                TestOp::MulSum => (0..n).map(|r| premul_scalar(r) * self.value(r, idx)).sum(),
                TestOp::Prod => vals.product(),
                TestOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                TestOp::Min => vals.fold(f64::INFINITY, f64::min),
            };
            if op == TestOp::Avg {
                return Expect::Approx(v / n as f64);
            }
            return self.exact(v);
        }
        // Integers: wrapping arithmetic at 64 bits, truncated to the width
        // (sums and products modulo 2^k agree with any narrower width).
        let vals = (0..n).map(|r| self.value(r, idx) as i64);
        let v: i64 = match op {
            TestOp::Sum => vals.fold(0i64, |a, v| a.wrapping_add(v)),
            TestOp::MulSum => (0..n).fold(0i64, |a, r| {
                a.wrapping_add((premul_scalar(r) as i64).wrapping_mul(self.value(r, idx) as i64))
            }),
            TestOp::Prod => vals.fold(1i64, |a, v| a.wrapping_mul(v)),
            TestOp::Max => vals.max().unwrap_or(0),
            TestOp::Min => vals.min().unwrap_or(0),
            TestOp::Avg => vals.sum::<i64>() / n as i64,
        };
        let mut b = [0u8; 8];
        b.copy_from_slice(&v.to_le_bytes());
        Expect::Exact(b)
    }

    /// Whether `got` (one encoded element) matches `want`.
    pub fn matches(&self, want: &Expect, got: &[u8]) -> bool {
        let size = self.dtype.size();
        match want {
            Expect::Exact(b) => b[..size] == got[..size],
            Expect::Approx(v) => {
                let g = codec::decode(self.dtype, got);
                let n = self.nranks as f64;
                let tol = codec::epsilon(self.dtype) * (n + 1.0) * v.abs().max(1.0 / n);
                (g - v).abs() <= tol
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_nccl_tests() {
        let c = Coll::AllGather.counts(1000, 4, 3);
        assert_eq!((c.send, c.recv, c.param), (332, 996, 332));
        let c = Coll::ReduceScatter.counts(8, 1, 4);
        assert_eq!((c.send, c.recv, c.param), (0, 0, 0));
        let c = Coll::AllReduce.counts(2, 4, 4);
        assert_eq!((c.send, c.recv, c.param), (2, 2, 2));
    }

    #[test]
    fn reductions_are_exact_within_each_type() {
        for dtype in DataType::ALL {
            for op in TestOp::ALL {
                for n in [1, 2, 3, 4, 8, 16] {
                    let pat = Pattern::new(dtype, Some(op), n, 3);
                    for idx in 0..200 {
                        for r in 0..n {
                            let v = pat.value(r, idx);
                            let mut b = [0u8; 8];
                            codec::encode(dtype, v, &mut b);
                            assert_eq!(codec::decode(dtype, &b), v, "{dtype:?} {op:?} n={n} value");
                        }
                        if let Expect::Exact(b) = pat.reduce(idx) {
                            assert!(pat.matches(&Expect::Exact(b), &b));
                        }
                    }
                }
            }
        }
    }
}
