//! The symbolic executor: runs every rank's schedule together and proves
//! what it computes.
//!
//! # Model
//!
//! * **Memory.** Each rank has its send and receive buffers (lengths from
//!   [`CollKind::send_len`] / [`CollKind::recv_len`]). In place, the smaller
//!   buffer lives inside the larger one at
//!   [`CollKind::in_place_send_offset`] / [`CollKind::in_place_recv_offset`],
//!   so a write through one is seen through the other. (A rank whose smaller
//!   buffer does not fit in the larger one, such as a non-root rank of an
//!   in-place Reduce, and the collectives without an in-place form, such as
//!   AlltoAll, keep separate buffers.) Element `i` of rank `r`'s send buffer
//!   starts as the symbolic input [`Term`] `(r, i)`; the receive buffer
//!   starts uninitialized.
//! * **Values.** A value is the ordered list of the inputs reduced into it,
//!   in accumulation order (`acc op input` appends), plus a `finished` flag
//!   set by `recvReduceCopy` / `recvReduceCopySend`, whose output is a final
//!   result. Reducing a finished value again is an error, as is reading the
//!   send buffer of a reducing collective (which applies the op's input
//!   transform) after it was overwritten.
//! * **Connections.** Every `(channel, from, to)` pair is a FIFO of
//!   `fifo_elems` elements; each queued element is tagged with the message
//!   it belongs to. A receiving primitive consumes exactly one whole message
//!   of exactly its own length.
//! * **Progress.** Execution is element-granular. A primitive has an
//!   element side, which receives, reduces and writes its elements one at a
//!   time and in order (receiving element `j` needs it at the head of the
//!   incoming FIFO), and a send side, which sends element `j` once the
//!   element side has produced it and the outgoing FIFO has room (fewer
//!   than `fifo_elems` queued). So a forwarding primitive never sends
//!   element `j` before receiving it, and holds at most its own message.
//!   The primitives of a step interleave freely, except that primitives
//!   sharing a send peer (or a receive peer) move their messages in listed
//!   order. A step ends when all its primitives are done; the steps of a
//!   channel run in order; channels run independently.
//! * **Races.** Because the primitives of a step and the channels of a rank
//!   run concurrently, they must not touch the same memory unless all of
//!   them only read it; the executor checks this before running, so that its
//!   results do not depend on the order it happens to pick.
//!
//! When no rank can move and some rank has not finished, the schedules
//! deadlock. At the end every FIFO must be empty and every output element
//! must hold exactly the right inputs, each once; reducing collectives (with
//! more than one rank) must have finished every output element, and
//! AllReduce must have reduced every element in the same order on every rank
//! (bitwise-identical results).

mod checks;
mod element;
mod error;
mod exec;
mod memory;
mod outcome;

pub use error::{Loc, Stuck, Term, VerifyError, Wait};

use crate::{Algorithm, CollSpec, Params, Rank, Schedule, Topology};
use exec::Sim;

/// What a verified set of schedules does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps run, over all ranks and channels.
    pub steps: usize,
    /// The most steps of one channel of one rank (the critical path).
    pub max_steps: usize,
    /// Primitives run.
    pub prims: usize,
    /// Messages sent.
    pub messages: usize,
    /// Elements sent over connections.
    pub elements_sent: usize,
    /// Elements reduced (one per `acc op input`).
    pub elements_reduced: usize,
    /// Elements copied locally by `copy` and `copySend` (no-op copies
    /// excluded).
    pub elements_copied: usize,
}

/// Build every rank's schedule with `alg` on one host and verify them
/// together, with FIFOs of `params.chunk_elems` elements: [`verify_on`] with
/// [`Topology::flat`].
///
/// `in_place` aliases the buffers as NCCL's in-place forms do (see the
/// module documentation); collectives without an in-place form (AlltoAll)
/// are verified with separate buffers either way.
pub fn verify(
    alg: &dyn Algorithm,
    spec: &CollSpec,
    params: &Params,
    in_place: bool,
) -> Result<Stats, VerifyError> {
    verify_on(alg, spec, params, &Topology::flat(spec.nranks), in_place)
}

/// Build every rank's schedule with `alg` for the ranks placed as `topo`
/// says, and verify them together, with FIFOs of `params.chunk_elems`
/// elements.
pub fn verify_on(
    alg: &dyn Algorithm,
    spec: &CollSpec,
    params: &Params,
    topo: &Topology,
    in_place: bool,
) -> Result<Stats, VerifyError> {
    let schedules = schedules_for(alg, spec, params, topo, in_place)?;
    verify_schedules(spec, &schedules, in_place, params.chunk_elems)
}

/// The order each output element was reduced in, once [`verify_on`]'s
/// checks pass: `orders[r][i]` lists the ranks whose inputs rank `r`'s
/// receive element `i` holds, in accumulation order. This is what a
/// deterministic reduction keeps fixed.
pub fn reduction_orders(
    alg: &dyn Algorithm,
    spec: &CollSpec,
    params: &Params,
    topo: &Topology,
    in_place: bool,
) -> Result<Vec<Vec<Vec<Rank>>>, VerifyError> {
    let schedules = schedules_for(alg, spec, params, topo, in_place)?;
    Ok(checked(spec, &schedules, in_place, params.chunk_elems)?.orders())
}

/// Every rank's schedule of `alg` for the call, once the call, the cut and
/// the placement are ones `alg` can be verified on.
fn schedules_for(
    alg: &dyn Algorithm,
    spec: &CollSpec,
    params: &Params,
    topo: &Topology,
    in_place: bool,
) -> Result<Vec<Schedule>, VerifyError> {
    if !alg.supports(spec.kind) {
        return Err(VerifyError::Unsupported {
            alg: alg.name(),
            kind: spec.kind.name(),
        });
    }
    check_call(spec)?;
    if params.nchannels == 0 || params.chunk_elems == 0 {
        return Err(VerifyError::InvalidCall(format!(
            "nchannels ({}) and chunk_elems ({}) must be at least 1",
            params.nchannels, params.chunk_elems
        )));
    }
    if topo.nranks() != spec.nranks {
        return Err(VerifyError::InvalidCall(format!(
            "topology of {} ranks for a call of {}",
            topo.nranks(),
            spec.nranks
        )));
    }
    if !alg.supports_topology(topo) {
        return Err(VerifyError::InvalidCall(format!(
            "{} does not support this placement of ranks on hosts",
            alg.name()
        )));
    }
    if in_place && !alg.supports_in_place(spec.kind) {
        return Err(VerifyError::InPlaceUnsupported {
            alg: alg.name(),
            kind: spec.kind.name(),
        });
    }
    Ok((0..spec.nranks)
        .map(|r| alg.schedule(spec, r, params, topo))
        .collect())
}

fn check_call(spec: &CollSpec) -> Result<(), VerifyError> {
    if spec.nranks == 0 {
        return Err(VerifyError::InvalidCall("no ranks".into()));
    }
    if spec.kind.has_root() && spec.root >= spec.nranks {
        return Err(VerifyError::InvalidCall(format!(
            "root {} out of range ({} ranks)",
            spec.root, spec.nranks
        )));
    }
    let max = spec
        .kind
        .send_len(spec.count, spec.nranks, spec.root, spec.root);
    let max = max.max(
        spec.kind
            .recv_len(spec.count, spec.nranks, spec.root, spec.root),
    );
    if spec.nranks > u32::MAX as usize || max > u32::MAX as usize {
        return Err(VerifyError::InvalidCall("call too large to verify".into()));
    }
    Ok(())
}

/// Verify the schedules of every rank (`schedules[r]` is rank `r`'s) for
/// `spec`, with FIFOs of `fifo_elems` elements per `(channel, from, to)`.
///
/// This is how a user-supplied schedule is checked before it is run.
pub fn verify_schedules(
    spec: &CollSpec,
    schedules: &[Schedule],
    in_place: bool,
    fifo_elems: usize,
) -> Result<Stats, VerifyError> {
    Ok(checked(spec, schedules, in_place, fifo_elems)?.stats)
}

/// The executor after running `schedules` and passing every check.
fn checked<'a>(
    spec: &'a CollSpec,
    schedules: &'a [Schedule],
    in_place: bool,
    fifo_elems: usize,
) -> Result<Sim<'a>, VerifyError> {
    check_call(spec)?;
    if fifo_elems == 0 {
        return Err(VerifyError::InvalidCall("FIFOs of zero elements".into()));
    }
    if schedules.len() != spec.nranks {
        return Err(VerifyError::WrongScheduleCount {
            got: schedules.len(),
            nranks: spec.nranks,
        });
    }
    let mut sim = Sim::new(spec, schedules, in_place, fifo_elems);
    sim.check_static()?;
    sim.run()?;
    sim.check_result()?;
    Ok(sim)
}
