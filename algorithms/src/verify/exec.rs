//! The executor's progress: every rank's channels advance step by step,
//! each primitive receiving, producing and sending element by element
//! through bounded FIFOs, until all are done or none can move (a deadlock).

use std::collections::{HashMap, VecDeque};

use super::memory::{At, Chains, Mem, Val};
use super::{Loc, Stats, Stuck, Term, VerifyError, Wait};
use crate::{CollSpec, Prim, Rank, Schedule};

/// One element queued on a connection, tagged with its message.
struct Elem {
    val: Val,
    msg_len: usize,
    step: u32,
    prim: u32,
}

/// Progress of a channel's current step.
///
/// Each primitive has two sides: the element side (receive, compute, write)
/// and the send side, which sends element `j` only once the element side has
/// produced it. Produced elements not yet sent wait in `pending`.
struct Active {
    /// Elements produced (received / read and computed).
    made: Vec<usize>,
    /// Elements sent.
    sent: Vec<usize>,
    /// Produced elements waiting for room in the outgoing FIFO.
    pending: Vec<VecDeque<Val>>,
    /// The previous primitive of the step with the same receive peer.
    prev_recv: Vec<usize>,
    /// The previous primitive of the step with the same send peer.
    prev_send: Vec<usize>,
}

pub(super) const NONE: usize = usize::MAX;

impl Active {
    fn new(prims: &[Prim]) -> Active {
        let mut last_recv = HashMap::new();
        let mut last_send = HashMap::new();
        let mut prev_recv = Vec::with_capacity(prims.len());
        let mut prev_send = Vec::with_capacity(prims.len());
        for (i, p) in prims.iter().enumerate() {
            prev_recv.push(match p.recv_peer() {
                Some(peer) => last_recv.insert(peer, i).unwrap_or(NONE),
                None => NONE,
            });
            prev_send.push(match p.send_peer() {
                Some(peer) => last_send.insert(peer, i).unwrap_or(NONE),
                None => NONE,
            });
        }
        Active {
            made: vec![0; prims.len()],
            sent: vec![0; prims.len()],
            pending: (0..prims.len()).map(|_| VecDeque::new()).collect(),
            prev_recv,
            prev_send,
        }
    }

    /// Whether primitive `q` (or none) has received / produced everything.
    fn made_all(&self, prims: &[Prim], q: usize) -> bool {
        q == NONE || self.made[q] == prims[q].len()
    }

    /// Whether primitive `q` (or none) has sent everything.
    fn sent_all(&self, prims: &[Prim], q: usize) -> bool {
        q == NONE || prims[q].send_peer().is_none() || self.sent[q] == prims[q].len()
    }

    /// Whether primitive `q` is done.
    fn finished(&self, prims: &[Prim], q: usize) -> bool {
        self.made_all(prims, q) && self.sent_all(prims, q)
    }
}

/// A channel's place in its schedule.
struct Chan {
    step: usize,
    active: Option<Active>,
}

/// The executor: every rank's memory, every connection's FIFO and every
/// channel's progress.
pub(super) struct Sim<'a> {
    pub(super) spec: CollSpec,
    pub(super) scheds: &'a [Schedule],
    pub(super) n: usize,
    nch: usize,
    cap: usize,
    pub(super) mems: Vec<Mem>,
    pub(super) chains: Chains,
    fifos: Vec<VecDeque<Elem>>,
    chans: Vec<Vec<Chan>>,
    pub(super) stats: Stats,
    pub(super) scratch_a: Vec<Term>,
    pub(super) scratch_b: Vec<Term>,
}

impl<'a> Sim<'a> {
    pub(super) fn new(
        spec: &CollSpec,
        scheds: &'a [Schedule],
        in_place: bool,
        cap: usize,
    ) -> Sim<'a> {
        let n = spec.nranks;
        let nch = scheds.iter().map(|s| s.channels.len()).max().unwrap_or(0);
        let mut chains = Chains::default();
        let mems = (0..n)
            .map(|r| Mem::new(spec, r, in_place, &mut chains))
            .collect();
        let chans = (0..n)
            .map(|_| {
                (0..nch)
                    .map(|_| Chan {
                        step: 0,
                        active: None,
                    })
                    .collect()
            })
            .collect();
        Sim {
            spec: *spec,
            scheds,
            n,
            nch,
            cap,
            mems,
            chains,
            fifos: (0..nch * n * n).map(|_| VecDeque::new()).collect(),
            chans,
            stats: Stats::default(),
            scratch_a: Vec::new(),
            scratch_b: Vec::new(),
        }
    }

    pub(super) fn loc(&self, rank: Rank, channel: usize, step: usize, prim: usize) -> Loc {
        let name = self.scheds[rank].channels[channel][step].prims[prim].name();
        Loc {
            rank,
            channel,
            step,
            prim,
            name,
        }
    }

    pub(super) fn loc_at(&self, rank: Rank, at: At) -> Loc {
        self.loc(
            rank,
            at.channel as usize,
            at.step as usize,
            at.prim as usize,
        )
    }

    pub(super) fn conn(&self, channel: usize, from: Rank, to: Rank) -> usize {
        (channel * self.n + from) * self.n + to
    }

    pub(super) fn run(&mut self) -> Result<(), VerifyError> {
        loop {
            let mut progressed = false;
            for r in 0..self.n {
                for c in 0..self.nch {
                    progressed |= self.advance(r, c)?;
                }
            }
            if !progressed {
                break;
            }
        }
        let mut stuck = Vec::new();
        for r in 0..self.n {
            for c in 0..self.nch {
                if let Some(s) = self.stuck(r, c) {
                    stuck.push(s);
                }
            }
        }
        if !stuck.is_empty() {
            return Err(VerifyError::Deadlock { stuck });
        }
        for c in 0..self.nch {
            for from in 0..self.n {
                for to in 0..self.n {
                    let q = &self.fifos[self.conn(c, from, to)];
                    if let Some(e) = q.front() {
                        return Err(VerifyError::LeftoverMessages {
                            channel: c,
                            from,
                            to,
                            elements: q.len(),
                            sender: self.loc(from, c, e.step as usize, e.prim as usize),
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Why channel `c` of rank `r` cannot finish, if it has not.
    fn stuck(&self, r: Rank, c: usize) -> Option<Stuck> {
        let steps = self.scheds[r].channels.get(c)?;
        let st = &self.chans[r][c];
        let step = steps.get(st.step)?;
        let active = st.active.as_ref()?;
        let prims = &step.prims;
        for (p, prim) in prims.iter().enumerate() {
            if let Some(from) = prim.recv_peer() {
                if !active.made_all(prims, p)
                    && active.made_all(prims, active.prev_recv[p])
                    && self.fifos[self.conn(c, from, r)].is_empty()
                {
                    return Some(Stuck {
                        at: self.loc(r, c, st.step, p),
                        waits: Wait::RecvFrom(from),
                    });
                }
            }
            if let Some(to) = prim.send_peer() {
                if !active.pending[p].is_empty()
                    && active.sent_all(prims, active.prev_send[p])
                    && self.fifos[self.conn(c, r, to)].len() >= self.cap
                {
                    return Some(Stuck {
                        at: self.loc(r, c, st.step, p),
                        waits: Wait::SendTo(to),
                    });
                }
            }
        }
        None
    }

    /// Move channel `c` of rank `r` as far as it goes; whether it moved.
    fn advance(&mut self, r: Rank, c: usize) -> Result<bool, VerifyError> {
        let scheds = self.scheds;
        let Some(steps) = scheds[r].channels.get(c) else {
            return Ok(false);
        };
        let mut any = false;
        loop {
            let s = self.chans[r][c].step;
            let Some(step) = steps.get(s) else {
                return Ok(any);
            };
            let mut active = self.chans[r][c]
                .active
                .take()
                .unwrap_or_else(|| Active::new(&step.prims));
            let mut moved = false;
            for p in 0..step.prims.len() {
                moved |= self.move_prim(r, c, s, p, &step.prims, &mut active)?;
            }
            if (0..step.prims.len()).all(|p| active.finished(&step.prims, p)) {
                let chan = &mut self.chans[r][c];
                chan.step += 1;
                self.stats.steps += 1;
                self.stats.prims += step.prims.len();
                self.stats.max_steps = self.stats.max_steps.max(chan.step);
                any = true;
                continue;
            }
            self.chans[r][c].active = Some(active);
            any |= moved;
            if !moved {
                return Ok(any);
            }
        }
    }

    /// Move primitive `p` as far as it goes; whether it moved.
    fn move_prim(
        &mut self,
        r: Rank,
        c: usize,
        s: usize,
        p: usize,
        prims: &[Prim],
        active: &mut Active,
    ) -> Result<bool, VerifyError> {
        let prim = &prims[p];
        let len = prim.len();
        let mut moved = false;
        let name = prim.name();
        let at = move || Loc {
            rank: r,
            channel: c,
            step: s,
            prim: p,
            name,
        };

        // The element side: receive, compute, write.
        if active.made[p] < len && active.made_all(prims, active.prev_recv[p]) {
            let me = At {
                channel: c as u32,
                step: s as u32,
                prim: p as u32,
            };
            let reduces = self.spec.kind.reduces();
            let inq = prim.recv_peer().map(|f| self.conn(c, f, r));
            let start = active.made[p];
            let mut j = start;
            while j < len {
                let mut incoming = None;
                if let Some(i) = inq {
                    let Some(head) = self.fifos[i].front() else {
                        break;
                    };
                    if j == 0 && head.msg_len != len {
                        let from = prim.recv_peer().unwrap_or(NONE);
                        return Err(VerifyError::MessageLengthMismatch {
                            at: at(),
                            from,
                            expected: len,
                            got: head.msg_len,
                            sender: self.loc(from, c, head.step as usize, head.prim as usize),
                        });
                    }
                    incoming = self.fifos[i].pop_front().map(|e| e.val);
                }
                let out = self.produce(r, prim, j, incoming, reduces, me, at)?;
                if let Some(v) = out {
                    active.pending[p].push_back(v);
                }
                j += 1;
            }
            active.made[p] = j;
            moved |= j > start;
        }

        // The send side: element j leaves once it is produced.
        if let Some(to) = prim.send_peer() {
            if active.sent_all(prims, active.prev_send[p]) {
                let o = self.conn(c, r, to);
                while self.fifos[o].len() < self.cap {
                    let Some(val) = active.pending[p].pop_front() else {
                        break;
                    };
                    if active.sent[p] == 0 {
                        self.stats.messages += 1;
                    }
                    self.stats.elements_sent += 1;
                    self.fifos[o].push_back(Elem {
                        val,
                        msg_len: len,
                        step: s as u32,
                        prim: p as u32,
                    });
                    active.sent[p] += 1;
                    moved = true;
                }
            }
        }
        Ok(moved)
    }
}
