//! Moving bytes: the sending side matches sends to the receiver's FIFO
//! entries, writes them and signals each slot; the receiving side posts
//! FIFO entries and collects the sizes each slot signalled.

use super::*;

pub(super) struct SendOpState {
    pub(super) data: u64,
    pub(super) size: usize,
    pub(super) tag: i32,
    pub(super) lkey: u32,
    /// Work requests not yet completed: its data's, and its slot's signal
    /// (one for all queue pairs). Done only once the signal landed: a
    /// sender that closes after its last send completed (its process may
    /// end) leaves the receiver nothing to wait for.
    pub(super) left: usize,
    /// The FIFO slot it was matched to.
    pub(super) slot: Option<u64>,
    /// Matched to a FIFO entry and its data posted.
    pub(super) posted: bool,
    pub(super) state: OpState,
}

pub(super) struct SendState {
    pub(super) link: Link,
    /// The peer's size area.
    pub(super) sizes_addr: u64,
    pub(super) sizes_rkey: u32,
    pub(super) ops: Posted<SendOpState>,
    /// The first send not matched to a FIFO entry yet.
    pub(super) next_match: u64,
    /// The FIFO slot being filled.
    pub(super) slot: u64,
    /// The slot's entries, and the size of the send each got.
    pub(super) entries: Vec<(CtsEntry, Option<usize>)>,
    /// Slots signalled whose signals have not all completed: per slot,
    /// the work requests left.
    pub(super) signals: VecDeque<(u64, usize)>,
}

// SAFETY: the raw addresses in `ops` point into registered memory that the
// caller of `reg_mr` keeps valid and untouched while the sends are
// pending; the state is only reached through its mutex.
unsafe impl Send for SendState {}

pub(super) struct RecvGroup {
    pub(super) bufs: Vec<(usize, i32)>,
    pub(super) sizes: Vec<usize>,
    /// Signals (one per queue pair) not yet arrived.
    pub(super) left: usize,
    pub(super) state: OpState,
}

pub(super) struct RecvState {
    pub(super) link: Link,
    /// The peer's FIFO.
    pub(super) fifo_addr: u64,
    pub(super) fifo_rkey: u32,
    pub(super) groups: Posted<RecvGroup>,
    pub(super) max_recvs: usize,
}

/// A sending communicator.
pub struct IbSend {
    pub(super) state: Arc<Mutex<SendState>>,
    pub(super) peer: String,
}

/// A receiving communicator.
pub struct IbRecv {
    pub(super) state: Arc<Mutex<RecvState>>,
    pub(super) peer: String,
}

impl Endpoint for IbSend {
    fn peer(&self) -> String {
        self.peer.clone()
    }
}

impl Endpoint for IbRecv {
    fn peer(&self) -> String {
        self.peer.clone()
    }
}

/// A registration: the bytes it covers and the device's region.
pub struct IbMr {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) mr: Box<dyn MemoryRegion>,
}

impl std::fmt::Debug for IbMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbMr")
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

impl Registration for IbMr {
    fn bounds(&self) -> (usize, usize) {
        (self.start, self.len)
    }
}

/// A send, receive or flush in flight.
pub struct IbRequest(pub(super) Request<SendState, RecvState>);

impl Side for SendState {
    type Op = SendOpState;

    fn posted(&self) -> &Posted<SendOpState> {
        &self.ops
    }

    fn posted_mut(&mut self) -> &mut Posted<SendOpState> {
        &mut self.ops
    }

    fn op_state(op: &mut SendOpState) -> &mut OpState {
        &mut op.state
    }

    fn sizes(op: &SendOpState) -> Sizes {
        Sizes::new(&[op.size])
    }

    fn progress(&mut self) {
        SendState::progress(self);
    }

    fn broken(&self) -> Option<NetError> {
        self.link.broken()
    }

    fn retire(&mut self) {
        SendState::retire(self);
    }
}

impl Side for RecvState {
    type Op = RecvGroup;

    fn posted(&self) -> &Posted<RecvGroup> {
        &self.groups
    }

    fn posted_mut(&mut self) -> &mut Posted<RecvGroup> {
        &mut self.groups
    }

    fn op_state(op: &mut RecvGroup) -> &mut OpState {
        &mut op.state
    }

    fn sizes(op: &RecvGroup) -> Sizes {
        Sizes::new(&op.sizes)
    }

    fn progress(&mut self) {
        RecvState::progress(self);
    }

    fn broken(&self) -> Option<NetError> {
        self.link.broken()
    }

    fn retire(&mut self) {
        RecvState::retire(self);
    }
}

impl SendState {
    /// Forgets spent requests at the front.
    pub(super) fn retire(&mut self) {
        self.ops
            .retire(|op| op.state == OpState::Spent && op.posted);
    }

    /// Moves what can move: completions, then sends onto FIFO entries.
    pub(super) fn progress(&mut self) {
        let mut wcs = Vec::new();
        let healthy = self.link.poll("sending to", &mut wcs);
        for wc in wcs {
            let id = wc.wr_id & !WR_KIND;
            match wc.wr_id & WR_KIND {
                WR_DATA => {
                    let op = self.ops.get_mut(id);
                    op.left -= 1;
                    if op.left == 0 {
                        op.state.finish();
                    }
                }
                WR_SIGNAL => {
                    let Some(signal) = self.signals.iter_mut().find(|(slot, _)| *slot == id) else {
                        continue;
                    };
                    signal.1 -= 1;
                    if signal.1 == 0 {
                        for op in self.ops.iter_mut().filter(|op| op.slot == Some(id)) {
                            op.left -= 1;
                            if op.left == 0 {
                                op.state.finish();
                            }
                        }
                    }
                    while self.signals.front().is_some_and(|(_, left)| *left == 0) {
                        self.signals.pop_front();
                    }
                }
                _ => {}
            }
        }
        if !healthy {
            return;
        }
        while self.next_match < self.ops.next_id() {
            if !self.match_next() {
                break;
            }
        }
        self.retire();
    }

    /// Reads the current slot's entries if they are all there.
    pub(super) fn read_slot(&mut self) -> bool {
        if !self.entries.is_empty() {
            return true;
        }
        let base = (self.slot as usize % NET_MAX_REQUESTS) * MAX_RECVS;
        let seq = (self.slot + 1) as u32;
        let Some(first) = self.link.area.entry(base, seq) else {
            return false;
        };
        let nreqs = first.nreqs as usize;
        if !(1..=MAX_RECVS).contains(&nreqs) {
            self.link.fail_with(
                "receiving a FIFO entry from",
                io::ErrorKind::InvalidData,
                format!("a receive of {nreqs} buffers"),
            );
            return false;
        }
        let mut entries = Vec::with_capacity(nreqs);
        for r in 0..nreqs {
            match self.link.area.entry(base + r, seq) {
                Some(entry) => entries.push((entry, None)),
                None => return false,
            }
        }
        self.entries = entries;
        true
    }

    /// Matches the next send to an entry of the current slot and posts
    /// its data; signals the slot once every entry has its send. `false`
    /// when nothing more can move now.
    pub(super) fn match_next(&mut self) -> bool {
        if self.link.broken().is_some() || !self.read_slot() {
            return false;
        }
        let id = self.next_match;
        let (size, tag) = {
            let op = self.ops.get_mut(id);
            (op.size, op.tag)
        };
        let Some(r) = self
            .entries
            .iter()
            .position(|(entry, send)| send.is_none() && entry.tag == tag)
        else {
            // No buffer of the slot has this tag: the receiver fails.
            self.next_match += 1;
            let slot = self.slot;
            let op = self.ops.get_mut(id);
            op.posted = true;
            op.slot = Some(slot);
            op.left = 1;
            let sizes = vec![SIZE_BAD_TAG | u64::from(tag as u32); self.entries.len()];
            return self.signal(&sizes);
        };
        self.entries[r].1 = Some(size);
        self.next_match += 1;
        let entry = self.entries[r].0;
        let nqps = self.link.qps.len();
        // The slot's signal, then each data write.
        let mut left = 1;
        if size as u64 <= entry.size && size > 0 {
            let op = self.ops.get_mut(id);
            let (data, lkey) = (op.data, op.lkey);
            let chunk = size.div_ceil(nqps).next_multiple_of(128);
            for qp in 0..nqps {
                let start = qp * chunk;
                if start >= size {
                    break;
                }
                let len = chunk.min(size - start);
                let wr = SendWr {
                    wr_id: WR_DATA | id,
                    sge: Some(Sge {
                        addr: data + start as u64,
                        len: len as u32,
                        lkey,
                    }),
                    op: SendOp::Write {
                        remote_addr: entry.addr + start as u64,
                        rkey: entry.rkey,
                        imm: None,
                    },
                    signaled: true,
                    inline: false,
                };
                if !self.link.post_send(qp, &[wr], "sending to") {
                    return false;
                }
                left += 1;
            }
        }
        let slot = self.slot;
        let op = self.ops.get_mut(id);
        op.posted = true;
        op.slot = Some(slot);
        op.left = left;
        if self.entries.iter().all(|(_, send)| send.is_some()) {
            let sizes: Vec<u64> = self
                .entries
                .iter()
                .map(|(entry, send)| {
                    let size = send.expect("all matched") as u64;
                    if size > entry.size {
                        SIZE_TRUNCATED | size
                    } else {
                        size
                    }
                })
                .collect();
            return self.signal(&sizes);
        }
        true
    }

    /// Writes the slot's sizes into the peer's size area and signals the
    /// slot on every queue pair; moves to the next slot.
    pub(super) fn signal(&mut self, sizes: &[u64]) -> bool {
        let slot = self.slot;
        let at = self.sizes_addr + ((slot as usize % NET_MAX_REQUESTS) * MAX_RECVS * 8) as u64;
        let bytes: Vec<u8> = sizes.iter().flat_map(|s| s.to_ne_bytes()).collect();
        let sizes_wr = SendWr {
            wr_id: WR_SIGNAL | slot,
            sge: Some(Sge {
                addr: bytes.as_ptr() as u64,
                len: bytes.len() as u32,
                lkey: 0,
            }),
            op: SendOp::Write {
                remote_addr: at,
                rkey: self.sizes_rkey,
                imm: None,
            },
            signaled: false,
            inline: true,
        };
        let nqps = self.link.qps.len();
        for qp in 0..nqps {
            let signal = SendWr {
                wr_id: WR_SIGNAL | slot,
                sge: None,
                op: SendOp::Write {
                    remote_addr: at,
                    rkey: self.sizes_rkey,
                    imm: Some(slot as u32),
                },
                signaled: true,
                inline: false,
            };
            let wrs: &[SendWr] = if qp == 0 {
                &[sizes_wr, signal]
            } else {
                &[signal]
            };
            if !self.link.post_send(qp, wrs, "sending to") {
                return false;
            }
        }
        self.signals.push_back((slot, nqps));
        self.slot += 1;
        self.entries.clear();
        true
    }
}

impl RecvState {
    pub(super) fn retire(&mut self) {
        self.groups.retire(|group| group.state == OpState::Spent);
    }

    pub(super) fn progress(&mut self) {
        let mut wcs = Vec::new();
        // A failed link still hands over what completed before it failed;
        // the rest fails at `test`.
        self.link.poll("receiving from", &mut wcs);
        for wc in wcs {
            if wc.opcode != WcOpcode::RecvRdmaWithImm {
                continue;
            }
            let id = wc.wr_id & !WR_KIND;
            let group = self.groups.get_mut(id);
            group.left -= 1;
            if group.left > 0 {
                continue;
            }
            let base = (id as usize % NET_MAX_REQUESTS) * MAX_RECVS;
            let mut error = None;
            for (r, &(cap, _)) in group.bufs.iter().enumerate() {
                let word = self.link.area.size(base + r);
                if word & SIZE_TRUNCATED != 0 {
                    error = Some(NetError::Truncated {
                        peer: self.link.peer.clone(),
                        sent: word & !SIZE_TRUNCATED,
                        posted: cap,
                    });
                } else if word & SIZE_BAD_TAG != 0 {
                    error = Some(NetError::UnexpectedTag {
                        peer: self.link.peer.clone(),
                        tag: word as u32 as i32,
                    });
                } else {
                    group.sizes.push(word as usize);
                }
                if error.is_some() {
                    break;
                }
            }
            match error {
                Some(err) => {
                    self.link.fail(err);
                    return;
                }
                None => group.state.finish(),
            }
        }
        self.retire();
    }
}
