//! Deterministic reductions (`NCCL_DETERMINISTIC=1`, [`Config::deterministic`]):
//! the reducing collectives run the ordered ring, which reduces each
//! output element in one order fixed by the element's index and the rank
//! count ([`reduction_order`]), so their bits do not depend on the
//! algorithm asked for, the protocol, the channels, the chunk, the ranks'
//! hosts, the transport or the memory. [`reference`] computes the same
//! bits serially, on one CPU.
//!
//! [`Config::deterministic`]: crate::Config::deterministic

pub use rccl_algorithms::reduction_order;
use rccl_algorithms::{CollKind, CollSpec};

use crate::api::Element;
use crate::error::{Error, Result};
use crate::kernels::ReduceKernel;
use crate::types::RedOp;

/// What `rank` receives from a deterministic `kind` (AllReduce,
/// ReduceScatter, or Reduce with `rank` its root) over `inputs`, one send
/// buffer per rank: each element folded in [`reduction_order`]'s order
/// with the host kernels, `acc = pre(x[first])`, then `acc = acc op
/// pre(x[next])` for each next rank, the output transform on the last
/// (the steps the ordered ring's primitives take).
pub fn reference<T: Element>(
    kind: CollKind,
    inputs: &[&[T]],
    op: RedOp,
    rank: usize,
) -> Result<Vec<T>> {
    let nranks = inputs.len();
    let len = inputs.first().map_or(0, |x| x.len());
    if nranks == 0 || rank >= nranks || inputs.iter().any(|x| x.len() != len) {
        return Err(Error::InvalidArgument(format!(
            "a reference reduction takes one input of the same length per rank and a rank \
             among them: {nranks} inputs of lengths {:?}, rank {rank}",
            inputs.iter().map(|x| x.len()).collect::<Vec<_>>()
        )));
    }
    let count = match kind {
        CollKind::AllReduce | CollKind::Reduce => len,
        CollKind::ReduceScatter if len.is_multiple_of(nranks) => len / nranks,
        CollKind::ReduceScatter => {
            return Err(Error::InvalidArgument(format!(
                "a ReduceScatter input of {len} elements does not split over {nranks} ranks"
            )))
        }
        other => {
            return Err(Error::InvalidArgument(format!(
                "{} does not reduce",
                other.name()
            )))
        }
    };
    let spec = CollSpec {
        kind,
        nranks,
        root: rank,
        count,
    };
    let kernel = ReduceKernel::new(T::DATATYPE, op, nranks)?;
    let first = if kind == CollKind::ReduceScatter {
        rank * count
    } else {
        0
    };
    Ok((0..count)
        .map(|i| {
            let order = reduction_order(&spec, rank, i).expect("an element of the call");
            let mut acc: Option<T> = None;
            for (step, &from) in order.iter().enumerate() {
                let x = inputs[from][first + i];
                let mut out = x;
                let last = step + 1 == order.len();
                let acc_ptr = acc.as_ref().map(|a| a as *const T as *const u8);
                // SAFETY: `acc`, `x` and `out` are each one element of the
                // kernel's datatype (`T::DATATYPE`), live for the call.
                unsafe {
                    kernel.run(
                        acc_ptr,
                        &x as *const T as *const u8,
                        &mut out as *mut T as *mut u8,
                        1,
                        last,
                    )
                };
                acc = Some(out);
            }
            acc.expect("at least one rank")
        })
        .collect())
}
