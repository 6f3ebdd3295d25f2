//! The checks that need no execution: peers, slice lengths and bounds, and
//! races between primitives that run concurrently.

use super::exec::{Sim, NONE};
use super::memory::At;
use super::{Loc, VerifyError};
use crate::Buf;

impl Sim<'_> {
    /// Checks that need no execution: peers, lengths, bounds and races.
    pub(super) fn check_static(&self) -> Result<(), VerifyError> {
        let n = self.n;
        for (r, sched) in self.scheds.iter().enumerate() {
            let mem = &self.mems[r];
            let total = mem.cells.len();
            // Per element: the channel that writes it, and the primitive of
            // the current step that writes it.
            let mut chan_writer: Vec<Option<At>> = vec![None; total];
            let mut step_writer: Vec<(usize, u32)> = vec![(NONE, 0); total];
            let mut uid = 0;
            for (c, steps) in sched.channels.iter().enumerate() {
                for (s, step) in steps.iter().enumerate() {
                    uid += 1;
                    for (p, prim) in step.prims.iter().enumerate() {
                        let at = Loc {
                            rank: r,
                            channel: c,
                            step: s,
                            prim: p,
                            name: prim.name(),
                        };
                        for peer in prim.send_peer().into_iter().chain(prim.recv_peer()) {
                            if peer >= n {
                                return Err(VerifyError::PeerOutOfRange {
                                    at,
                                    peer,
                                    nranks: n,
                                });
                            }
                            if peer == r {
                                return Err(VerifyError::SelfPeer { at, peer });
                            }
                        }
                        let (src, dst) = prim.slices();
                        if let (Some(src), Some(dst)) = (src, dst) {
                            if src.len != dst.len {
                                return Err(VerifyError::SliceLengthMismatch {
                                    at,
                                    src: src.len,
                                    dst: dst.len,
                                });
                            }
                        }
                        if prim.is_empty() {
                            return Err(VerifyError::EmptyPrim { at });
                        }
                        for slice in src.iter().chain(dst.iter()) {
                            let buf_len = mem.len(slice.buf);
                            let fits = matches!(
                                slice.offset.checked_add(slice.len),
                                Some(end) if end <= buf_len
                            );
                            if !fits {
                                return Err(VerifyError::OutOfBounds {
                                    at,
                                    slice: *slice,
                                    buf_len,
                                });
                            }
                        }
                        if let (Some(src), Some(dst)) = (src, dst) {
                            let (a, b) = (mem.addr(&src, 0), mem.addr(&dst, 0));
                            if a != b && a < b + dst.len && b < a + src.len {
                                return Err(VerifyError::OverlappingSlices { at, src, dst });
                            }
                        }
                        // Writes first, then reads, against earlier
                        // primitives of the step and other channels.
                        let me = At {
                            channel: c as u32,
                            step: s as u32,
                            prim: p as u32,
                        };
                        for (slice, writes) in dst
                            .iter()
                            .map(|d| (d, true))
                            .chain(src.iter().map(|s| (s, false)))
                        {
                            for j in 0..slice.len {
                                let a = mem.addr(slice, j);
                                let race = |other: At| VerifyError::Race {
                                    at,
                                    other: self.loc_at(r, other),
                                    buf: slice.buf,
                                    index: slice.offset + j,
                                };
                                if let Some(w) = chan_writer[a] {
                                    if w.channel != me.channel {
                                        return Err(race(w));
                                    }
                                }
                                let (u, wp) = step_writer[a];
                                if u == uid && wp != me.prim {
                                    return Err(race(At { prim: wp, ..me }));
                                }
                                if writes {
                                    chan_writer[a] = Some(me);
                                    step_writer[a] = (uid, me.prim);
                                }
                            }
                        }
                    }
                    // Reads of an element written by a later primitive of
                    // the same step.
                    for (p, prim) in step.prims.iter().enumerate() {
                        if let (Some(src), _) = prim.slices() {
                            for j in 0..src.len {
                                let (u, wp) = step_writer[mem.addr(&src, j)];
                                if u == uid && wp as usize > p {
                                    let other = self.loc(r, c, s, wp as usize);
                                    return Err(VerifyError::Race {
                                        at: other,
                                        other: self.loc(r, c, s, p),
                                        buf: src.buf,
                                        index: src.offset + j,
                                    });
                                }
                            }
                        }
                    }
                }
            }
            // Reads by an earlier channel of elements a later channel writes.
            let mut chan_reader: Vec<Option<At>> = vec![None; total];
            for (c, steps) in sched.channels.iter().enumerate() {
                for (s, step) in steps.iter().enumerate() {
                    for (p, prim) in step.prims.iter().enumerate() {
                        if let (Some(src), _) = prim.slices() {
                            for j in 0..src.len {
                                let a = mem.addr(&src, j);
                                if chan_reader[a].is_none() {
                                    chan_reader[a] = Some(At {
                                        channel: c as u32,
                                        step: s as u32,
                                        prim: p as u32,
                                    });
                                }
                            }
                        }
                    }
                }
            }
            for a in 0..total {
                if let (Some(rd), Some(w)) = (chan_reader[a], chan_writer[a]) {
                    if rd.channel != w.channel {
                        let (buf, index) = if a >= mem.recv_base && a < mem.recv_base + mem.recv_len
                        {
                            (Buf::Recv, a - mem.recv_base)
                        } else {
                            (Buf::Send, a - mem.send_base)
                        };
                        return Err(VerifyError::Race {
                            at: self.loc_at(r, w),
                            other: self.loc_at(r, rd),
                            buf,
                            index,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}
