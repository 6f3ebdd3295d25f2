//! One-shot's all-reduce: every rank sends its input to every other and
//! reduces all of them.

use rccl_algorithms::CollKind;

use super::Call;

pub(super) fn time(call: &Call) -> Option<f64> {
    match call.spec.kind {
        CollKind::AllReduce => Some(all_reduce(call)),
        _ => None,
    }
}

fn all_reduce(call: &Call) -> f64 {
    let Call {
        ref f,
        n,
        per_channel,
        ..
    } = *call;
    // Every rank sends its input to every other and reduces all n.
    let chunks = (per_channel / f.chunk).ceil().max(1.0);
    let s = per_channel / chunks;
    let out_nic = f.local * (n - f.local) * s / (f.nic * f.rails.min(f.channels) / f.channels);
    let out_port = (n - 1.0) * s / (f.port / f.channels);
    // Each of the n inputs joins the accumulator in a step of its
    // own, in one order on every rank, after the inputs are in:
    // within a host a rank's port takes them in one after the
    // other (a rank whose transfers are its own copies makes them
    // on the same core, before its reductions). Across hosts the
    // inputs join in one order on every rank while each rank sends
    // in its own, so some rank's first input is the last its
    // sender's NICs carry: its reductions start once they drain.
    let step = n * f.step + (n - 1.0) * s / f.reduce;
    let step = if f.hosts > 1.0 {
        step + out_nic
    } else {
        step + out_port
    };
    chunks * step.max(out_nic).max(out_port) + f.arrival(s, f.hosts > 1.0)
}
