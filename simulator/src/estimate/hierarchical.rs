//! Hier's forms: phases of rings inside each host and rail rings across
//! hosts, one after the other (all-reduce) or, for reduce-scatter, as a
//! pipeline of two stages over the hosts' blocks.

use rccl_algorithms::CollKind;

use super::Call;

pub(super) fn time(call: &Call) -> Option<f64> {
    Some(match call.spec.kind {
        CollKind::AllReduce => all_reduce(call),
        CollKind::AllGather | CollKind::ReduceScatter => all_gather_or_reduce_scatter(call),
        _ => return None,
    })
}

fn all_reduce(call: &Call) -> f64 {
    let Call {
        ref f, per_channel, ..
    } = *call;
    // Reduce-scatter rings inside each host, all-reduce rings across
    // hosts on a share `1/local` of the data (the host's rings on
    // the channel's NIC), all-gather rings inside, one phase after
    // the other.
    let (m, h) = (f.local, f.hosts);
    let inner = if m > 1.0 {
        f.ring_steps(m - 1.0, per_channel / m, 0.0, f.reduce, false)
            + f.ring_steps(m - 1.0, per_channel / m, 0.0, f.copy, true)
    } else {
        0.0
    };
    let outer = if h > 1.0 {
        let block = per_channel / (m * h);
        let chain = f.ring_steps(2.0 * (h - 1.0), block, 1.0, f.reduce, false);
        chain.max(f.rail_rings(2.0 * (h - 1.0) * block * m))
    } else {
        0.0
    };
    inner + outer
}

fn all_gather_or_reduce_scatter(call: &Call) -> f64 {
    let Call {
        ref f, per_channel, ..
    } = *call;
    let kind = call.spec.kind;
    // Rail rings across hosts move each rank's block, rings inside
    // each host the hosts' blocks.
    let (m, h) = (f.local, f.hosts);
    let rate = if kind == CollKind::AllGather {
        f.copy
    } else {
        f.reduce
    };
    // Inside, a step passes on one message per host's block.
    let inner = if m > 1.0 {
        h * f.ring_steps(m - 1.0, per_channel, 0.0, rate, kind == CollKind::AllGather)
    } else {
        0.0
    };
    let outer = if h > 1.0 {
        let chain = f.ring_steps(h - 1.0, per_channel, 1.0, rate, false);
        chain.max(f.rail_rings((h - 1.0) * per_channel * m))
    } else {
        0.0
    };
    // Reduce-scatter reduces inside a host one host's block at a
    // time while the rail rings carry the blocks reduced before:
    // a pipeline of two stages over `h` blocks. Where a rank's
    // transfers are its own copies, the stages share its core: the
    // first block goes through both, the others at the slower
    // stage's pace; a DMA engine hides all but the slower stage.
    if kind == CollKind::ReduceScatter {
        let fill = if f.sender_copies {
            inner.min(outer) / h
        } else {
            0.0
        };
        // With one channel of such ranks, the stages also wait
        // on each other: the host's ring for the next block needs
        // every rank's rail message, which the host's NIC
        // delivers one after another, and the NIC's next round
        // waits for the host's ring. Each round takes the ring
        // and all but one of the host's messages on the NIC.
        // (With more channels, one channel's ring runs while
        // another's messages wait.)
        let lockstep = if f.sender_copies && f.channels < 2.0 && h > 1.0 && m > 1.0 {
            inner + (m - 1.0) * (h - 1.0) * per_channel / f.nic_total()
        } else {
            0.0
        };
        (inner.max(outer) + fill).max(lockstep)
    } else {
        inner + outer
    }
}
