//! The harness's own collectives, on the bookkeeping communicators:
//! barriers, all-reduced times and error counts, and gathered per-rank
//! times.

use rccl::{CollCall, CollKind, DataType, RedOp};

use super::worker::Worker;
use super::Res;
use crate::perf::format::engine_error;

/// Runs `f` inside a group when `enabled`, always closing the group.
pub(super) fn grouped(enabled: bool, f: impl FnOnce() -> rccl::Result<()>) -> rccl::Result<()> {
    if !enabled {
        return f();
    }
    rccl::group_start();
    let r = f();
    let end = rccl::group_end();
    r.and(end)
}

impl Worker<'_> {
    /// All-reduces one f64 per thread over every rank (`Sum`, `Min`, `Max`,
    /// or with `None` the value of rank 0). Every rank of the thread
    /// contributes `value` (a sum over ranks is then `ngpus` times the sum
    /// over threads).
    pub(super) fn allreduce(&mut self, value: f64, op: Option<RedOp>) -> Res<f64> {
        let sends = vec![value; self.ranks.len()];
        self.allreduce_each(&sends, op)
    }

    /// Sums a per-thread count over every thread of every process.
    pub(super) fn sum_over_threads(&mut self, value: f64) -> Res<f64> {
        let sends: Vec<f64> = (0..self.ranks.len())
            .map(|i| if i == 0 { value } else { 0.0 })
            .collect();
        self.allreduce_each(&sends, Some(RedOp::Sum))
    }

    fn allreduce_each(&mut self, sends: &[f64], op: Option<RedOp>) -> Res<f64> {
        let mut recvs = vec![0f64; self.ranks.len()];
        let multi = self.ranks.len() > 1;
        grouped(multi, || {
            for ((rank, s), r) in self.ranks.iter().zip(sends).zip(recvs.iter_mut()) {
                let (kind, op) = match op {
                    Some(op) => (CollKind::AllReduce, op),
                    None => (CollKind::Broadcast, RedOp::Sum),
                };
                // SAFETY: one f64 each, alive until the group ends.
                unsafe {
                    rank.books.collective_raw(
                        CollCall {
                            kind,
                            count: 1,
                            dtype: DataType::Float64,
                            op,
                            root: 0,
                        },
                        (s as *const f64).cast(),
                        (r as *mut f64).cast(),
                    )?
                };
            }
            Ok(())
        })
        .map_err(engine_error("stats all-reduce"))?;
        Ok(recvs[0])
    }

    /// Waits for every rank's work to complete (on device memory, its
    /// stream), then for every other thread and process.
    pub(super) fn barrier(&mut self) -> Res<()> {
        self.complete()?;
        self.allreduce(0.0, Some(RedOp::Sum)).map(|_| ())
    }

    /// Waits for the work queued on this thread's ranks' streams (nothing
    /// to wait for on host memory, whose calls complete before they
    /// return).
    pub(super) fn complete(&self) -> Res<()> {
        for rank in &self.ranks {
            rank.complete()
                .map_err(engine_error(self.coll.program_name()))?;
        }
        Ok(())
    }

    /// All-gathers `values` (the same length on every rank; every rank of
    /// this thread contributes the same values) into rank order.
    pub(super) fn gather_f64(&mut self, values: &[f64]) -> Res<Vec<f64>> {
        let len = values.len();
        let mut recvs = vec![vec![0f64; len * self.nranks]; self.ranks.len()];
        let multi = self.ranks.len() > 1;
        grouped(multi, || {
            for (rank, r) in self.ranks.iter().zip(recvs.iter_mut()) {
                // SAFETY: values holds len f64 and r holds len * nranks, both
                // alive until the group ends.
                unsafe {
                    rank.books.collective_raw(
                        CollCall {
                            kind: CollKind::AllGather,
                            count: len,
                            dtype: DataType::Float64,
                            op: RedOp::Sum,
                            root: 0,
                        },
                        values.as_ptr().cast(),
                        r.as_mut_ptr().cast(),
                    )?
                };
            }
            Ok(())
        })
        .map_err(engine_error("per-rank times all-gather"))?;
        Ok(recvs.swap_remove(0))
    }
}
