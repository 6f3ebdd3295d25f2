//! Direct's forms: all-to-all, gather and scatter, every pair's chunks
//! at once, over a rank's port and a host's NICs.

use rccl_algorithms::CollKind;

use super::Call;

pub(super) fn time(call: &Call) -> Option<f64> {
    match call.spec.kind {
        CollKind::AllToAll | CollKind::Gather | CollKind::Scatter => Some(exchange(call)),
        _ => None,
    }
}

fn exchange(call: &Call) -> f64 {
    let Call {
        ref f,
        n,
        per_channel,
        ..
    } = *call;
    let chunks = (per_channel / f.chunk).ceil().max(1.0);
    let s = per_channel / chunks;
    let out_port = (n - 1.0) * s / (f.port / f.channels);
    let remote = if f.hosts > 1.0 {
        f.local * (n - f.local) * s / (f.nic * f.rails)
    } else {
        0.0
    };
    chunks * (f.step + s / f.copy).max(out_port).max(remote) + f.arrival(s, f.hosts > 1.0)
}
