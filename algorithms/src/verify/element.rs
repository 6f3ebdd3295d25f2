//! What a primitive does to one element: read it, reduce it into what was
//! received, write it, and what it passes on.

use super::exec::Sim;
use super::memory::{At, Cell, Val, NIL};
use super::{Loc, VerifyError};
use crate::{Buf, Prim, Rank, Slice};

impl Sim<'_> {
    /// Element `j` of `prim`: read, reduce, write; what it sends, if it
    /// sends.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn produce(
        &mut self,
        r: Rank,
        prim: &Prim,
        j: usize,
        incoming: Option<Val>,
        reduces: bool,
        me: At,
        at: impl Fn() -> Loc + Copy,
    ) -> Result<Option<Val>, VerifyError> {
        let received = || incoming.expect("receiving primitive with a message");
        Ok(match *prim {
            Prim::Send { src, .. } => Some(self.read(r, &src, j, reduces, at)?),
            Prim::Recv { dst, .. } => {
                self.write(r, &dst, j, received(), me);
                None
            }
            Prim::Copy { src, dst } => {
                let v = self.read(r, &src, j, reduces, at)?;
                self.copy(r, &src, &dst, j, v, me);
                None
            }
            Prim::CopySend { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                self.copy(r, &src, &dst, j, v, me);
                Some(v)
            }
            Prim::RecvReduceSend { src, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                Some(self.reduce(received(), v, j, at)?)
            }
            Prim::RecvReduceCopy { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                let mut v = self.reduce(received(), v, j, at)?;
                v.finished = true;
                self.write(r, &dst, j, v, me);
                None
            }
            Prim::RecvReduceCopySend { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                let mut v = self.reduce(received(), v, j, at)?;
                v.finished = true;
                self.write(r, &dst, j, v, me);
                Some(v)
            }
            Prim::RecvCopySend { dst, .. } => {
                let v = received();
                self.write(r, &dst, j, v, me);
                Some(v)
            }
            Prim::RecvReduceCopyPartial { src, dst, .. } => {
                let v = self.read(r, &src, j, reduces, at)?;
                let v = self.reduce(received(), v, j, at)?;
                self.write(r, &dst, j, v, me);
                None
            }
            Prim::ReduceCopy { src, dst } | Prim::ReduceCopyPartial { src, dst } => {
                let a = self.read(r, &src, j, reduces, at)?;
                let b = self.read(r, &dst, j, reduces, at)?;
                let mut v = self.reduce(a, b, j, at)?;
                v.finished = matches!(prim, Prim::ReduceCopy { .. });
                self.write(r, &dst, j, v, me);
                None
            }
        })
    }

    fn read(
        &self,
        r: Rank,
        src: &Slice,
        j: usize,
        reduces: bool,
        at: impl Fn() -> Loc,
    ) -> Result<Val, VerifyError> {
        let mem = &self.mems[r];
        let cell = mem.cells[mem.addr(src, j)];
        if cell.chain == NIL {
            return Err(VerifyError::Uninitialized {
                at: at(),
                buf: src.buf,
                index: src.offset + j,
            });
        }
        if reduces && src.buf == Buf::Send && !cell.input {
            return Err(VerifyError::InputOverwritten {
                at: at(),
                index: src.offset + j,
                writer: cell.writer.map(|w| self.loc_at(r, w)),
            });
        }
        if reduces && src.buf == Buf::Recv && cell.input {
            return Err(VerifyError::UntransformedInput {
                at: at(),
                index: src.offset + j,
            });
        }
        Ok(Val {
            chain: cell.chain,
            finished: cell.finished,
        })
    }

    fn write(&mut self, r: Rank, dst: &Slice, j: usize, v: Val, me: At) {
        let mem = &mut self.mems[r];
        let a = mem.addr(dst, j);
        mem.cells[a] = Cell {
            chain: v.chain,
            finished: v.finished,
            input: false,
            writer: Some(me),
        };
    }

    /// `dst = src`: a no-op when both name the same memory.
    fn copy(&mut self, r: Rank, src: &Slice, dst: &Slice, j: usize, v: Val, me: At) {
        let mem = &self.mems[r];
        if mem.addr(src, j) != mem.addr(dst, j) {
            self.stats.elements_copied += 1;
            self.write(r, dst, j, v, me);
        }
    }

    /// `acc op input`.
    fn reduce(
        &mut self,
        acc: Val,
        input: Val,
        j: usize,
        at: impl Fn() -> Loc,
    ) -> Result<Val, VerifyError> {
        for v in [acc, input] {
            if v.finished {
                return Err(VerifyError::DoubleReduction {
                    at: at(),
                    index: j,
                    value: self.chains.show(v),
                });
            }
        }
        let (mut a, mut b) = (
            std::mem::take(&mut self.scratch_a),
            std::mem::take(&mut self.scratch_b),
        );
        self.chains.terms(acc.chain, &mut a);
        self.chains.terms(input.chain, &mut b);
        let elem = a[0].index;
        let mut chain = acc.chain;
        let mut result = Ok(());
        for (k, &t) in b.iter().enumerate() {
            if t.index != elem {
                result = Err(VerifyError::MixedElements {
                    at: at(),
                    index: j,
                    value: self.chains.show(acc),
                    other: self.chains.show(input),
                });
                break;
            }
            if a.contains(&t) || b[..k].contains(&t) {
                result = Err(VerifyError::DuplicateInput {
                    at: at(),
                    index: j,
                    term: t,
                    value: self.chains.show(acc),
                });
                break;
            }
            chain = self.chains.push(chain, t);
        }
        self.scratch_a = a;
        self.scratch_b = b;
        result?;
        self.stats.elements_reduced += 1;
        Ok(Val {
            chain,
            finished: false,
        })
    }
}
