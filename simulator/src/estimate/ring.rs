//! The ring's forms: all-reduce, all-gather and reduce-scatter as passes
//! of messages around the ring at its [`Pace`], broadcast and reduce as a
//! pipeline down a chain from the root.

use rccl_algorithms::CollKind;

use super::{Call, Pace};

pub(super) fn time(call: &Call) -> Option<f64> {
    Some(match call.spec.kind {
        CollKind::AllReduce => all_reduce(call),
        CollKind::AllGather | CollKind::ReduceScatter => all_gather_or_reduce_scatter(call),
        CollKind::Broadcast | CollKind::Reduce => chain(call),
        _ => return None,
    })
}

fn all_reduce(call: &Call) -> f64 {
    let Call {
        ref f,
        n,
        per_channel,
        ring_across,
        ..
    } = *call;
    let loops = (per_channel / (n * f.chunk)).ceil().max(1.0);
    let s = (per_channel / (n * loops)).max(1.0);
    // Reduce-scatter steps, then all-gather steps that also keep
    // what passes, as one pass around the ring per loop.
    let (reduce, copy) = (
        f.pace(s, ring_across, f.reduce),
        f.pace(s, ring_across, f.copy),
    );
    Pace {
        hop: (reduce.hop + copy.hop + f.kept(s, ring_across)) / 2.0,
        turn: (reduce.turn + copy.turn) / 2.0,
        link: (reduce.link + copy.link) / 2.0,
        tail: reduce.tail,
    }
    .run(loops, 2.0 * (n - 1.0), f.lead())
}

fn all_gather_or_reduce_scatter(call: &Call) -> f64 {
    let Call {
        ref f,
        n,
        per_channel,
        ring_across,
        ..
    } = *call;
    let kind = call.spec.kind;
    let loops = (per_channel / f.chunk).ceil().max(1.0);
    let s = (per_channel / loops).max(1.0);
    let pace = if kind == CollKind::ReduceScatter {
        f.pace(s, ring_across, f.reduce)
    } else {
        let copy = f.pace(s, ring_across, f.copy);
        Pace {
            hop: copy.hop + f.kept(s, ring_across),
            ..copy
        }
    };
    pace.run(loops, n - 1.0, f.lead())
}

/// Broadcast and reduce.
fn chain(call: &Call) -> f64 {
    let Call {
        ref f,
        n,
        bytes,
        per_channel,
        ..
    } = *call;
    let kind = call.spec.kind;
    let rate = if kind == CollKind::Reduce {
        f.reduce
    } else {
        f.copy
    };
    let nic_bytes = if f.hosts > 1.0 { bytes } else { 0.0 };
    // A chain from the root: it crosses into each other host once.
    let across = (f.hosts - 1.0) / (n - 1.0);
    // A broadcast's rank keeps what it passes on: where its
    // transfers within a host are its own copies, the copy into
    // its own buffer follows each transfer on the same core, as
    // many bytes again at the copy rate.
    let kept = if kind == CollKind::Broadcast {
        f.kept(bytes, across) * f.port
    } else {
        0.0
    };
    f.pipeline(
        n - 1.0,
        across,
        per_channel,
        1.0,
        rate,
        nic_bytes,
        bytes + kept,
    )
}
