//! Small helpers the algorithms share: pipeline chunks and step lists that
//! drop zero-length primitives.

use crate::{CollSpec, Prim, Schedule, Slice, Step};

/// Pipeline chunks `(offset, len)` of `[offset, offset + len)`, each at most
/// `chunk` elements.
pub(crate) fn chunks(
    offset: usize,
    len: usize,
    chunk: usize,
) -> impl Iterator<Item = (usize, usize)> {
    (0..len)
        .step_by(chunk.max(1))
        .map(move |i| (offset + i, chunk.min(len - i)))
}

/// A channel's step list under construction. Zero-length primitives are
/// dropped (every rank computes the same lengths, so sender and receiver
/// skip the same messages), and so are steps left empty.
#[derive(Default)]
pub(crate) struct Steps {
    pub(crate) steps: Vec<Step>,
}

impl Steps {
    /// A step of one primitive.
    pub(crate) fn one(&mut self, prim: Prim) {
        self.step(vec![prim]);
    }

    /// A step of concurrent primitives.
    pub(crate) fn step(&mut self, prims: Vec<Prim>) {
        let prims: Vec<Prim> = prims.into_iter().filter(|p| !p.is_empty()).collect();
        if !prims.is_empty() {
            self.steps.push(Step { prims });
        }
    }
}

/// The schedule of a call whose ranks have nothing to exchange: no steps
/// for an empty call, and on a single rank one `copy` of its receive
/// buffer's length from the send buffer. `None` when ranks must talk.
pub(crate) fn local_only(spec: &CollSpec, nchannels: usize) -> Option<Schedule> {
    let mut schedule = Schedule::new(nchannels);
    if spec.count == 0 {
        return Some(schedule);
    }
    if spec.nranks != 1 {
        return None;
    }
    let len = spec.kind.recv_len(spec.count, 1, 0, 0);
    schedule.channels[0].push(Step::one(Prim::Copy {
        src: Slice::send(0, len),
        dst: Slice::recv(0, len),
    }));
    Some(schedule)
}
