//! The event loop: schedules compacted into ops per (rank, channel)
//! thread ([`Threads`]), replayed over the links' busy intervals until
//! every thread is done ([`replay`]).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use rccl_algorithms::{Prim, Schedule};

use crate::cluster::{ProtoSpec, SimError};

use super::net::{Geo, Net};
use super::{FIFO_SLOTS, MAX_PRIMS};

/// What a compacted primitive does: takes a message in,
const RECV: u8 = 1;
/// sends one out,
const SEND: u8 = 2;
/// reduces (else copies),
const REDUCE: u8 = 4;
/// writes the rank's own buffer besides (or instead of) a transfer.
const LOCAL: u8 = 8;
/// sends to a rank outside the replayed period (folded onto one inside):
/// the transfer leaves the period's leaf group.
const AWAY: u8 = 16;

/// One primitive, compacted: 16 bytes.
#[derive(Clone, Copy, Debug)]
struct Op {
    from: u32,
    to: u32,
    bytes: u32,
    flags: u8,
}

fn compact(prim: &Prim, elem: usize, fold: usize) -> Op {
    let bytes = (prim.len() * elem) as u32;
    let m = |r: usize| (r % fold) as u32;
    let away = |to: usize| if to >= fold { AWAY } else { 0 };
    let (flags, from, to) = match *prim {
        Prim::Send { to, .. } => (SEND | away(to), 0, m(to)),
        Prim::Recv { from, .. } => (RECV, m(from), 0),
        Prim::Copy { src, dst } => {
            let same = src.buf == dst.buf && src.offset == dst.offset;
            (if same { 0 } else { LOCAL }, 0, 0)
        }
        Prim::CopySend { src, dst, to } => {
            let copy = if src.buf == dst.buf && src.offset == dst.offset {
                0
            } else {
                LOCAL
            };
            (SEND | copy | away(to), 0, m(to))
        }
        Prim::RecvReduceSend { from, to, .. } => (RECV | SEND | REDUCE | away(to), m(from), m(to)),
        Prim::RecvReduceCopySend { from, to, .. } => {
            (RECV | SEND | REDUCE | LOCAL | away(to), m(from), m(to))
        }
        Prim::RecvReduceCopy { from, .. } | Prim::RecvReduceCopyPartial { from, .. } => {
            (RECV | REDUCE, m(from), 0)
        }
        Prim::RecvCopySend { from, to, .. } => (RECV | SEND | LOCAL | away(to), m(from), m(to)),
        Prim::ReduceCopy { .. } | Prim::ReduceCopyPartial { .. } => (LOCAL | REDUCE, 0, 0),
    };
    Op {
        from,
        to,
        bytes,
        flags,
    }
}

/// The busy intervals of one link, in time order, none overlapping; a
/// booking that starts where another ends (or ends where one starts)
/// joins it, so that a link booked back to back, as a rank sending to
/// every other books its port, holds one interval, not one per message.
#[derive(Clone, Default)]
struct Busy(Vec<(f64, f64)>);

impl Busy {
    /// Books the link for `len` microseconds from the earliest time at or
    /// after `at` when it is idle that long, forgetting intervals that
    /// ended before `now` (the replay's clock only moves forward); returns
    /// the start.
    fn reserve(&mut self, at: f64, len: f64, now: f64) -> f64 {
        let past = self.0.partition_point(|&(_, end)| end <= now);
        self.0.drain(..past);
        // An interval ending before `at` cannot delay the booking.
        let mut i = self.0.partition_point(|&(_, end)| end < at);
        let mut start = at;
        while let Some(&(s, e)) = self.0.get(i) {
            if start + len <= s {
                break;
            }
            start = start.max(e);
            i += 1;
        }
        let end = start + len;
        let joins_before = len > 0.0 && i > 0 && self.0[i - 1].1 == start;
        let joins_after = len > 0.0 && self.0.get(i).is_some_and(|&(s, _)| s == end);
        match (joins_before, joins_after) {
            (true, true) => {
                self.0[i - 1].1 = self.0[i].1;
                self.0.remove(i);
            }
            (true, false) => self.0[i - 1].1 = end,
            (false, true) => self.0[i].0 = start,
            (false, false) => self.0.insert(i, (start, end)),
        }
        start
    }
}

/// Times of a message at its receiver: first piece in, last piece in.
#[derive(Clone, Copy)]
struct Msg {
    head: f64,
    tail: f64,
    /// Its path's `receive_scale`.
    receive_scale: f64,
}

/// Compact schedules: the ops and step boundaries of every (rank,
/// channel) thread, thread `rank * nch + channel`.
#[derive(Default)]
pub(super) struct Threads {
    ops: Vec<Vec<Op>>,
    steps: Vec<Vec<u32>>,
    total: u64,
}

impl Threads {
    /// The ops thread `thread` holds.
    pub(super) fn ops_in(&self, thread: usize) -> usize {
        self.ops[thread].len()
    }

    /// Appends `schedule` as the next rank's `nch` threads (ranks taken
    /// modulo `fold`).
    pub(super) fn push(
        &mut self,
        schedule: Schedule,
        nch: usize,
        elem_size: usize,
        fold: usize,
    ) -> Result<(), SimError> {
        let mut chans = schedule.channels;
        chans.resize(nch, Vec::new());
        for ch in chans {
            let mut o = Vec::new();
            let mut s = vec![0u32];
            for step in &ch {
                for p in &step.prims {
                    o.push(compact(p, elem_size, fold));
                }
                s.push(o.len() as u32);
            }
            self.total += o.len() as u64;
            if self.total > MAX_PRIMS {
                return Err(SimError(format!(
                    "more than {MAX_PRIMS} primitives to replay: choose a larger chunk or fewer ranks"
                )));
            }
            self.ops.push(o);
            self.steps.push(s);
        }
        Ok(())
    }
}

/// Replays `threads` (`nranks` ranks of `nch` channels) on `net`: when
/// each rank finished, and how many primitives ran.
pub(super) fn replay(
    net: &Net,
    geo: &Geo,
    proto: &ProtoSpec,
    threads: &Threads,
    nch: usize,
    nranks: usize,
) -> Result<(Vec<f64>, u64), SimError> {
    let (ops, steps) = (&threads.ops, &threads.steps);
    let nthreads = ops.len();
    let mut links: Vec<Busy> = vec![Busy::default(); net.bw.len()];
    let mut cursor = vec![0usize; nthreads];
    // Every thread with work starts once its rank has paid the call's
    // fixed cost; one without finishes at once.
    let start = |th: usize| {
        if steps[th].len() > 1 {
            proto.launch_us
        } else {
            0.0
        }
    };
    let mut ready: Vec<f64> = (0..nthreads).map(start).collect();
    let mut done_at = vec![0.0f64; nranks];
    let mut queues: HashMap<u64, VecDeque<Msg>, Fx> = HashMap::default();
    let mut waiting: HashMap<u64, usize, Fx> = HashMap::default();
    let mut heap: BinaryHeap<Reverse<(Time, usize)>> = ready
        .iter()
        .enumerate()
        .map(|(th, &at)| Reverse((Time(at), th)))
        .collect();
    let key =
        |from: u32, to: u32, ch: usize| ((from as u64) << 40) | ((to as u64) << 16) | ch as u64;
    let piece_cap = proto.slot_bytes as f64 * proto.efficiency;
    let fifo_bytes = piece_cap * FIFO_SLOTS as f64;
    let mut prims: u64 = 0;
    let mut mask: Vec<Vec<bool>> = vec![Vec::new(); nthreads];
    let mut step_end = vec![0.0f64; nthreads];
    // A rank whose transfers within a host are its own copies (a CPU
    // rank) makes every primitive of a step on its one core, one after
    // the other: the core time its step's primitives took so far.
    let one_core = net.sender_copies;
    let mut step_core = vec![0.0f64; nthreads];
    let mut blocked_recv: Vec<u32> = Vec::new();
    let mut blocked_send: Vec<u32> = Vec::new();

    while let Some(Reverse((Time(now), th))) = heap.pop() {
        let rank = th / nch;
        let ch = th % nch;
        let s = cursor[th];
        if s + 1 >= steps[th].len() {
            done_at[rank] = done_at[rank].max(ready[th]);
            continue;
        }
        let (lo, hi) = (steps[th][s] as usize, steps[th][s + 1] as usize);
        if mask[th].len() != hi - lo {
            mask[th].clear();
            mask[th].resize(hi - lo, false);
        }
        // The step's primitives progress independently: run every one
        // whose message is in, keeping each peer's messages in order.
        blocked_recv.clear();
        blocked_send.clear();
        let t = ready[th];
        let mut end = step_end[th].max(t);
        let mut complete = true;
        let (reduce_bw, copy_bw) = (net.reduce[rank], net.copy[rank]);
        for i in lo..hi {
            if mask[th][i - lo] {
                continue;
            }
            let op = ops[th][i];
            let recv_blocked = op.flags & RECV != 0 && {
                let k = key(op.from, rank as u32, ch);
                let empty = queues.get(&k).map_or(true, VecDeque::is_empty);
                if empty {
                    waiting.insert(k, th);
                }
                empty || blocked_recv.contains(&op.from)
            };
            let send_blocked = op.flags & SEND != 0 && blocked_send.contains(&op.to);
            if recv_blocked || send_blocked {
                complete = false;
                if op.flags & RECV != 0 {
                    blocked_recv.push(op.from);
                }
                if op.flags & SEND != 0 {
                    blocked_send.push(op.to);
                }
                continue;
            }
            mask[th][i - lo] = true;
            prims += 1;
            let bytes = op.bytes as f64;
            let s0 = t + proto.step_overhead_us;
            let piece = bytes.min(piece_cap);
            let proc_bw = if op.flags & REDUCE != 0 {
                reduce_bw
            } else {
                copy_bw
            };
            let mut op_end = s0;
            // The core time of this primitive's passes.
            let mut core = 0.0;
            let mut input: Option<Msg> = None;
            // The rate of the pass over the input, which its path sets.
            let mut proc_in = proc_bw;
            if op.flags & RECV != 0 {
                let k = key(op.from, rank as u32, ch);
                let m = queues
                    .get_mut(&k)
                    .and_then(VecDeque::pop_front)
                    .expect("checked above");
                let start = s0.max(m.head);
                proc_in = proc_bw * m.receive_scale;
                op_end = op_end.max((start + bytes / proc_in).max(m.tail + piece / proc_in));
                core = bytes / proc_in;
                input = Some(m);
            }
            if op.flags & LOCAL != 0 {
                op_end = op_end.max(s0 + bytes / proc_bw);
                core = bytes / proc_bw;
            }
            if op.flags & SEND != 0 {
                let dst = op.to as usize;
                let path = geo.path(net, rank, dst, ch, op.flags & AWAY != 0);
                // A forwarder processes a piece before it can send it, unless
                // its processing is the transfer itself.
                let stage = if path.sender_copies {
                    0.0
                } else {
                    piece / proc_in
                };
                let src_ready = match input {
                    Some(m) => s0.max(m.head) + stage,
                    None => s0,
                };
                let mut last_start = src_ready;
                let mut depart = src_ready;
                // When the last byte leaves the sender's own port.
                let mut sent = src_ready;
                let mut min_bw = f64::INFINITY;
                for (i, &l) in path.links[..path.len].iter().enumerate() {
                    let bw = net.bw[l] * proto.efficiency;
                    min_bw = min_bw.min(bw);
                    let start = links[l].reserve(src_ready, bytes / bw, now);
                    last_start = last_start.max(start);
                    depart = depart.max(start + bytes / bw);
                    if i == 0 {
                        sent = start + bytes / bw;
                    }
                }
                // A rank that makes its transfers itself also makes the
                // copy into its own buffer on the same core: after each
                // piece's transfer, not beside it.
                let serial_copy = path.sender_copies && op.flags & LOCAL != 0;
                if let Some(m) = input {
                    // Cannot outrun the input, nor its processing.
                    let floor = (m.tail + stage + piece / min_bw).max(src_ready + bytes / proc_in);
                    depart = depart.max(floor);
                    sent = sent.max(floor);
                } else if op.flags & LOCAL != 0 && !serial_copy {
                    depart = depart.max(src_ready + bytes / proc_bw);
                    sent = sent.max(src_ready + bytes / proc_bw);
                }
                if serial_copy {
                    let transfer = bytes / proc_in.min(min_bw);
                    depart = depart.max(src_ready + transfer + (bytes - piece) / copy_bw);
                    op_end = op_end.max(src_ready + transfer + bytes / copy_bw);
                }
                if path.sender_copies {
                    // The pass over the input writes into the transfer.
                    core = bytes / proc_in.min(min_bw)
                        + if serial_copy { bytes / copy_bw } else { 0.0 };
                }
                let msg = Msg {
                    head: last_start + piece / min_bw + path.latency,
                    tail: depart + path.latency,
                    receive_scale: path.receive_scale,
                };
                let k = key(rank as u32, op.to, ch);
                queues.entry(k).or_default().push_back(msg);
                if let Some(w) = waiting.remove(&k) {
                    heap.push(Reverse((Time(now), w)));
                }
                // A sender that copies is busy until its copy lands in the
                // peer's FIFO. A DMA or RDMA transfer (NVLink, a NIC) drains
                // the FIFO behind the sender: it moves on once its data is
                // staged and its port has drained all but a FIFO of it.
                op_end = op_end.max(if path.sender_copies {
                    depart
                } else {
                    sent - fifo_bytes / (net.bw[path.links[0]] * proto.efficiency)
                });
            }
            end = end.max(op_end);
            if one_core {
                step_core[th] += core;
                end = end.max(s0 + step_core[th]);
            }
        }
        if !complete {
            step_end[th] = end;
            continue;
        }
        mask[th].clear();
        step_end[th] = 0.0;
        step_core[th] = 0.0;
        cursor[th] += 1;
        ready[th] = end;
        heap.push(Reverse((Time(end), th)));
    }
    if let Some((&k, &th)) = waiting.iter().next() {
        return Err(SimError(format!(
            "deadlock: rank {} channel {} waits for a message from rank {} that never comes",
            th / nch,
            th % nch,
            k >> 40
        )));
    }
    Ok((done_at, prims))
}

/// A time ordered by `total_cmp`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Time(f64);

impl Eq for Time {}

impl PartialOrd for Time {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Time {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// A multiplicative hasher for the u64 connection keys.
#[derive(Clone, Copy, Default)]
struct Fx;

impl std::hash::BuildHasher for Fx {
    type Hasher = FxHasher;
    fn build_hasher(&self) -> FxHasher {
        FxHasher(0)
    }
}

struct FxHasher(u64);

impl std::hash::Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, v: u64) {
        // splitmix64's finalizer: every input bit reaches the low bits.
        let mut z = (self.0 ^ v).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        self.0 = z ^ (z >> 31);
    }
}
