//! The final check: every output element holds exactly the inputs the
//! collective defines, finished where it reduces, and AllReduce's results
//! are reduced in one order on every rank.

use super::exec::Sim;
use super::memory::{Cell, Val, NIL};
use super::{Term, VerifyError};
use crate::{CollKind, CollSpec, Rank};

impl Sim<'_> {
    /// The inputs each output element must hold, sorted.
    fn expected(&self, rank: Rank, index: usize, out: &mut Vec<Term>) {
        let CollSpec {
            kind,
            nranks,
            root,
            count,
        } = self.spec;
        let t = |r: usize, i: usize| Term {
            rank: r as u32,
            index: i as u32,
        };
        out.clear();
        match kind {
            CollKind::AllReduce | CollKind::Reduce => out.extend((0..nranks).map(|q| t(q, index))),
            CollKind::ReduceScatter => out.extend((0..nranks).map(|q| t(q, rank * count + index))),
            CollKind::Broadcast => out.push(t(root, index)),
            CollKind::AllGather | CollKind::Gather => out.push(t(index / count, index % count)),
            CollKind::AllToAll => out.push(t(index / count, rank * count + index % count)),
            CollKind::Scatter => out.push(t(root, rank * count + index)),
        }
    }

    pub(super) fn check_result(&self) -> Result<(), VerifyError> {
        let reduces = self.spec.kind.reduces();
        let mut expected = Vec::new();
        let mut got = Vec::new();
        let mut first: Option<VerifyError> = None;
        let mut wrong = 0;
        for (r, mem) in self.mems.iter().enumerate() {
            for i in 0..mem.recv_len {
                let cell = mem.cells[mem.recv_base + i];
                self.expected(r, i, &mut expected);
                let writer = cell.writer.map(|w| self.loc_at(r, w));
                let val = Val {
                    chain: cell.chain,
                    finished: cell.finished,
                };
                let ok = cell.chain != NIL && {
                    self.chains.terms(cell.chain, &mut got);
                    got.sort_unstable();
                    got == expected
                };
                if !ok {
                    wrong += 1;
                    if first.is_none() {
                        let show = |t: &[Term]| {
                            let body: Vec<String> = t.iter().map(|t| t.to_string()).collect();
                            format!("{{{}}}", body.join(","))
                        };
                        first = Some(VerifyError::WrongValue {
                            rank: r,
                            index: i,
                            expected: show(&expected),
                            got: if cell.chain == NIL {
                                "uninitialized memory".to_string()
                            } else {
                                self.chains.show(val)
                            },
                            writer,
                            wrong: 0,
                        });
                    }
                } else if reduces && self.n > 1 && !cell.finished && first.is_none() {
                    first = Some(VerifyError::NotFinished {
                        rank: r,
                        index: i,
                        got: self.chains.show(val),
                        writer,
                    });
                }
            }
        }
        match first {
            Some(VerifyError::WrongValue {
                rank,
                index,
                expected,
                got,
                writer,
                ..
            }) => {
                return Err(VerifyError::WrongValue {
                    rank,
                    index,
                    expected,
                    got,
                    writer,
                    wrong,
                })
            }
            Some(e) => return Err(e),
            None => {}
        }
        if self.spec.kind == CollKind::AllReduce {
            let base = &self.mems[0];
            for (r, mem) in self.mems.iter().enumerate().skip(1) {
                for i in 0..mem.recv_len {
                    let a = base.cells[base.recv_base + i];
                    let b = mem.cells[mem.recv_base + i];
                    if a.chain != b.chain {
                        let show = |c: Cell| {
                            self.chains.show(Val {
                                chain: c.chain,
                                finished: c.finished,
                            })
                        };
                        return Err(VerifyError::NotIdentical {
                            index: i,
                            rank_a: 0,
                            order_a: show(a),
                            rank_b: r,
                            order_b: show(b),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Each rank's receive elements as the ranks of their inputs, in
    /// accumulation order.
    pub(super) fn orders(&self) -> Vec<Vec<Vec<Rank>>> {
        let mut terms = Vec::new();
        self.mems
            .iter()
            .map(|mem| {
                (0..mem.recv_len)
                    .map(|i| {
                        self.chains
                            .terms(mem.cells[mem.recv_base + i].chain, &mut terms);
                        terms.iter().map(|t| t.rank as Rank).collect()
                    })
                    .collect()
            })
            .collect()
    }
}
