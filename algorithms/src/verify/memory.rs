//! Symbolic values and each rank's memory: a value is an interned list of
//! the inputs reduced into it, and a rank's send and receive buffers are one
//! array of cells, aliased as the in-place forms alias them.

use std::collections::HashMap;

use super::Term;
use crate::{Buf, CollSpec, Rank, Slice};

pub(super) const NIL: u32 = u32::MAX;

/// Interned reduction orders: a value is a node whose chain of parents lists
/// its inputs in accumulation order. Equal ids mean equal ordered lists.
#[derive(Default)]
pub(super) struct Chains {
    nodes: Vec<(u32, Term)>,
    index: HashMap<(u32, Term), u32>,
}

impl Chains {
    pub(super) fn push(&mut self, prev: u32, term: Term) -> u32 {
        let next = self.nodes.len() as u32;
        *self.index.entry((prev, term)).or_insert_with(|| {
            self.nodes.push((prev, term));
            next
        })
    }

    /// The inputs of `id`, in accumulation order.
    pub(super) fn terms(&self, mut id: u32, out: &mut Vec<Term>) {
        out.clear();
        while id != NIL {
            let (prev, t) = self.nodes[id as usize];
            out.push(t);
            id = prev;
        }
        out.reverse();
    }

    pub(super) fn show(&self, v: Val) -> String {
        let mut t = Vec::new();
        self.terms(v.chain, &mut t);
        let body = t
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join("+");
        if v.finished {
            format!("final[{body}]")
        } else {
            format!("[{body}]")
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Val {
    pub(super) chain: u32,
    pub(super) finished: bool,
}

/// A primitive's place, without the rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct At {
    pub(super) channel: u32,
    pub(super) step: u32,
    pub(super) prim: u32,
}

#[derive(Clone, Copy)]
pub(super) struct Cell {
    /// `NIL` while uninitialized.
    pub(super) chain: u32,
    pub(super) finished: bool,
    /// Still the rank's untouched input.
    pub(super) input: bool,
    pub(super) writer: Option<At>,
}

/// One rank's memory: both user buffers, aliased when in place.
pub(super) struct Mem {
    pub(super) send_base: usize,
    pub(super) send_len: usize,
    pub(super) recv_base: usize,
    pub(super) recv_len: usize,
    pub(super) cells: Vec<Cell>,
}

impl Mem {
    pub(super) fn new(spec: &CollSpec, rank: Rank, in_place: bool, chains: &mut Chains) -> Mem {
        let (kind, count, n, root) = (spec.kind, spec.count, spec.nranks, spec.root);
        let send_len = kind.send_len(count, n, rank, root);
        let recv_len = kind.recv_len(count, n, rank, root);
        let send_in_recv = kind
            .in_place_send_offset(count, rank, root)
            .filter(|o| in_place && o + send_len <= recv_len);
        let recv_in_send = kind
            .in_place_recv_offset(count, rank, root)
            .filter(|o| in_place && o + recv_len <= send_len);
        let (send_base, recv_base, total) = match (send_in_recv, recv_in_send) {
            (Some(o), _) => (o, 0, recv_len),
            (None, Some(o)) => (0, o, send_len),
            (None, None) => (0, send_len, send_len + recv_len),
        };
        let uninit = Cell {
            chain: NIL,
            finished: false,
            input: false,
            writer: None,
        };
        let mut cells = vec![uninit; total];
        for i in 0..send_len {
            let term = Term {
                rank: rank as u32,
                index: i as u32,
            };
            cells[send_base + i] = Cell {
                chain: chains.push(NIL, term),
                finished: false,
                input: true,
                writer: None,
            };
        }
        Mem {
            send_base,
            send_len,
            recv_base,
            recv_len,
            cells,
        }
    }

    pub(super) fn len(&self, buf: Buf) -> usize {
        match buf {
            Buf::Send => self.send_len,
            Buf::Recv => self.recv_len,
        }
    }

    pub(super) fn addr(&self, s: &Slice, j: usize) -> usize {
        match s.buf {
            Buf::Send => self.send_base + s.offset + j,
            Buf::Recv => self.recv_base + s.offset + j,
        }
    }
}
