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
use crate::types::{DataType, RedOp};

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
    let bytes: Vec<&[u8]> = inputs.iter().map(|x| bytemuck::cast_slice(x)).collect();
    let out = reference_bytes(kind, T::DATATYPE, &bytes, op, rank)?;
    Ok(out
        .chunks_exact(T::DATATYPE.size())
        .map(bytemuck::pod_read_unaligned)
        .collect())
}

/// [`reference`] over buffers of `dtype` elements as bytes, for callers
/// that know the datatype only at run time (as the C ABI's callers do).
pub fn reference_bytes(
    kind: CollKind,
    dtype: DataType,
    inputs: &[&[u8]],
    op: RedOp,
    rank: usize,
) -> Result<Vec<u8>> {
    let nranks = inputs.len();
    let size = dtype.size();
    let bytes = inputs.first().map_or(0, |x| x.len());
    if nranks == 0
        || rank >= nranks
        || !bytes.is_multiple_of(size)
        || inputs.iter().any(|x| x.len() != bytes)
    {
        return Err(Error::InvalidArgument(format!(
            "a reference reduction takes one input of the same whole number of {size}-byte \
             elements per rank and a rank among them: {nranks} inputs of {:?} bytes, rank {rank}",
            inputs.iter().map(|x| x.len()).collect::<Vec<_>>()
        )));
    }
    let len = bytes / size;
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
    let kernel = ReduceKernel::new(dtype, op, nranks)?;
    let first = if kind == CollKind::ReduceScatter {
        rank * count
    } else {
        0
    };
    let mut out = vec![0u8; count * size];
    let mut acc = vec![0u8; size];
    for (i, result) in out.chunks_exact_mut(size).enumerate() {
        let order = reduction_order(&spec, rank, i).expect("an element of the call");
        for (step, &from) in order.iter().enumerate() {
            let at = (first + i) * size;
            let x = &inputs[from][at..at + size];
            let last = step + 1 == order.len();
            let acc_ptr = (step > 0).then_some(acc.as_ptr());
            // SAFETY: `acc`, `x` and `result` are each one element of the
            // kernel's datatype, live for the call; the kernel reads its
            // inputs before it writes its output.
            unsafe { kernel.run(acc_ptr, x.as_ptr(), result.as_mut_ptr(), 1, last) };
            acc.copy_from_slice(result);
        }
    }
    Ok(out)
}
