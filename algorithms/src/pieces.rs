//! Small helpers the algorithms share: pipeline chunks and step lists that
//! drop zero-length primitives.

use crate::{Prim, Step};

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
