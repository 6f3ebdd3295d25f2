//! The tuner's cost model: closed forms of what the replay ([`simulate`])
//! predicts for the built-in algorithms, on the same cluster figures, so
//! that a decision takes microseconds at any scale. Each form follows the
//! algorithm's pipeline: the steps on its critical path, each paying the
//! step's fixed cost, the hop's latency and its first piece at the link's
//! rate, and the bytes the busiest link (a rank's port, a rail's NIC, on
//! the channel's share) or a rank's reduction must carry. The replay
//! stays the reference: `tests/closed_form.rs` ranks a grid of shapes
//! both ways.
//!
//! This module holds what the forms share: the call's [`Figures`] and
//! the pieces of a pipeline they are built from (a hop, a fill, a stream
//! of chunks, a ring's [`Pace`], an exchange); each algorithm's forms are
//! a file of their own, registered in [`form`] under the algorithm's
//! [`Builtin`] key. A new algorithm's forms are a new file here and a row
//! there.
//!
//! [`simulate`]: crate::simulate

mod direct;
mod halving_doubling;
mod hierarchical;
mod one_shot;
mod ring;
mod tree;

use rccl_algorithms::{CollSpec, Params};

use crate::builtin::Builtin;
use crate::cluster::{ClusterSpec, Occupancy, Protocol};
use crate::sim::{footprint, Regime};

/// The link and rank figures of a call, resolved once: bytes per
/// microsecond and microseconds.
struct Figures {
    /// Ranks, hosts, the fewest ranks on a host, rails.
    n: f64,
    hosts: f64,
    local: f64,
    rails: f64,
    /// Channels, chunk bytes.
    channels: f64,
    chunk: f64,
    /// Launch and per-step fixed cost.
    launch: f64,
    step: f64,
    /// A piece: the unit a forwarding primitive passes on.
    piece: f64,
    /// Within a host: a rank's port, its latency.
    port: f64,
    port_latency: f64,
    /// Across hosts: one NIC, its latency (switch hops included).
    nic: f64,
    nic_latency: f64,
    /// Whether a rank's transfer within a host is its own copy.
    sender_copies: bool,
    /// A rank's reduction and copy rates for this call.
    reduce: f64,
    copy: f64,
}

impl Figures {
    fn new(
        c: &ClusterSpec,
        spec: &CollSpec,
        elem_size: usize,
        protocol: Protocol,
        params: &Params,
    ) -> Figures {
        let proto = c.protocols.get(protocol);
        let Occupancy {
            hosts,
            fewest,
            most,
        } = c.occupancy();
        let rails = c.rails();
        // Every rank is on a pipeline's way, so the slowest sets its pace:
        // the root's footprint differs from the others' (a broadcast's
        // root reads what the others only write), and with it the cache
        // level or memory regime their rates come from.
        let rates = |rank: usize| Regime::of(c, footprint(spec, elem_size, rank), most).rates(c);
        let ((root_reduce, root_copy), (other_reduce, other_copy)) = (
            rates(spec.root),
            rates((spec.root + 1) % spec.nranks.max(1)),
        );
        let (reduce, copy) = (
            root_reduce.min(other_reduce) * 1e3,
            root_copy.min(other_copy) * 1e3,
        );
        let port = c.intra.map_or(f64::INFINITY, |i| {
            let p = i.port_gbs * 1e3;
            if i.sender_copies {
                p.min(copy) * i.handoff_scale
            } else {
                p
            }
        });
        let one_leaf = c.fabric.hosts_per_leaf >= hosts;
        let hops = if one_leaf { 1.0 } else { 3.0 };
        Figures {
            n: spec.nranks as f64,
            hosts: hosts as f64,
            local: fewest as f64,
            rails: rails as f64,
            channels: params.nchannels.max(1) as f64,
            chunk: (params.chunk_elems.max(1) * elem_size) as f64,
            launch: proto.launch_us,
            step: proto.step_overhead_us,
            piece: proto.slot_bytes as f64 * proto.efficiency,
            port: port * proto.efficiency,
            port_latency: c.intra.map_or(c.nic.latency_us, |i| i.latency_us)
                + proto.extra_latency_us,
            nic: c.nic.gbit / 8.0 * c.nic.efficiency * 1e3 * proto.efficiency,
            nic_latency: c.nic.latency_us + hops * c.fabric.hop_latency_us + proto.extra_latency_us,
            sender_copies: c.intra.is_some_and(|i| i.sender_copies),
            reduce,
            copy,
        }
    }

    /// The bandwidth of the NICs a host's channels use (channel `c` on
    /// rail `c mod rails`).
    fn nic_total(&self) -> f64 {
        self.nic * self.rails.min(self.channels)
    }

    /// A pipeline of `depth` hops (a share `across` of them between
    /// hosts) through which `per_channel` bytes flow chunk by chunk: the
    /// first piece's way down the pipeline ([`fill`](Self::fill)), then
    /// the [`stream`](Self::stream) of chunks.
    #[allow(clippy::too_many_arguments)]
    fn pipeline(
        &self,
        depth: f64,
        across: f64,
        per_channel: f64,
        steps: f64,
        rate: f64,
        nic_bytes: f64,
        port_bytes: f64,
    ) -> f64 {
        let piece = self.chunk_of(per_channel).1.min(self.piece);
        self.fill(depth, across, piece, rate)
            + self.stream(per_channel, across, steps, rate, nic_bytes, port_bytes)
    }

    /// How `per_channel` bytes split into chunks: their count and size.
    fn chunk_of(&self, per_channel: f64) -> (f64, f64) {
        let chunks = (per_channel / self.chunk).ceil().max(1.0);
        (chunks, (per_channel / chunks).max(1.0))
    }

    /// The first `piece`'s way down `depth` hops, a share `across` of them
    /// between hosts, each rank passing it on at `rate`. A forwarding rank
    /// passes each piece on as it comes in: its step's fixed cost overlaps
    /// the wait.
    fn fill(&self, depth: f64, across: f64, piece: f64, rate: f64) -> f64 {
        self.step
            + depth
                * (across * (piece / rate + self.hop(piece, true))
                    + (1.0 - across) * self.within_hop(piece, rate))
    }

    /// A `piece` passed on at `rate` to a rank of the same host. Where a
    /// rank's transfers within a host are its own copies, its pass over the
    /// piece is the piece's transfer, at the slower of the two rates.
    fn within_hop(&self, piece: f64, rate: f64) -> f64 {
        if self.sender_copies {
            self.port_latency + piece / rate.min(self.port)
        } else {
            piece / rate + self.hop(piece, false)
        }
    }

    /// `per_channel` bytes through a pipeline, a chunk per its slowest
    /// stage: the busiest rank's `steps` steps over a chunk at `rate`, or
    /// a host's NICs carrying `nic_bytes` and a rank's port `port_bytes`
    /// for the whole call (the first piece's way over a port, when any
    /// hop stays in a host, `across < 1`, is in the fill).
    fn stream(
        &self,
        per_channel: f64,
        across: f64,
        steps: f64,
        rate: f64,
        nic_bytes: f64,
        port_bytes: f64,
    ) -> f64 {
        let (chunks, s) = self.chunk_of(per_channel);
        let piece = s.min(self.piece);
        let stage = chunks * (steps * self.step + s / rate);
        // Likewise the first piece's way over a NIC, when any hop crosses.
        let nic = if across > 0.0 {
            (nic_bytes / self.nic_total() - piece / self.nic).max(0.0)
        } else {
            nic_bytes / self.nic_total()
        };
        let port = if across < 1.0 {
            (port_bytes / self.port - piece / (self.port / self.channels)).max(0.0)
        } else {
            0.0
        };
        stage.max(nic).max(port)
    }

    /// `steps` ring steps, each moving `block` bytes per channel in
    /// messages of at most a chunk, each rank keeping what passes when it
    /// `keeps`.
    fn ring_steps(&self, steps: f64, block: f64, across: f64, rate: f64, keeps: bool) -> f64 {
        let loops = (block / self.chunk).ceil().max(1.0);
        let s = (block / loops).max(1.0);
        let kept = if keeps { self.kept(s, across) } else { 0.0 };
        let pace = self.pace(s, across, rate);
        Pace {
            hop: pace.hop + kept,
            ..pace
        }
        .run(loops, steps, self.lead())
    }

    /// What a forwarding pipeline pays before its first message is on its
    /// way: where [`pace`](Self::pace) hides each later step's fixed cost
    /// behind the wait for a message, the first step's own.
    fn lead(&self) -> f64 {
        self.step
    }

    /// What a forwarding rank spends keeping a message of `s` bytes in its
    /// own buffer besides passing it on: when its transfers within a host
    /// are its own copies, a second copy on the same core.
    fn kept(&self, s: f64, across: f64) -> f64 {
        if self.sender_copies {
            (1.0 - across) * s / self.copy
        } else {
            0.0
        }
    }

    /// The wait for the last message of `s` bytes once its sender has
    /// sent it at the link's pace: the hop's latency, and a piece's
    /// transfer when it comes in more than one.
    fn arrival(&self, s: f64, across: bool) -> f64 {
        if s > self.piece {
            self.hop(s, across)
        } else {
            self.hop(0.0, across)
        }
    }

    /// Rail rings whose NICs carry `bytes` per channel, every rank of a
    /// host sending at once: the NICs' time, after the first step's fixed
    /// cost and before the last message's latency, which a queue of
    /// messages on a NIC does not hide.
    fn rail_rings(&self, bytes: f64) -> f64 {
        self.lead() + bytes * self.channels / self.nic_total() + self.nic_latency
    }

    /// Channels sharing one NIC.
    fn per_nic(&self) -> f64 {
        (self.channels / self.rails).ceil()
    }

    /// One hop of a message of `s` bytes: latency, then the message over
    /// the link (its first piece when it is forwarded piece by piece): a
    /// link carries one channel's message at a time at its full rate.
    fn hop(&self, s: f64, across: bool) -> f64 {
        if across {
            self.nic_latency + s.min(self.piece) / self.nic
        } else {
            self.port_latency + s.min(self.piece) / self.port
        }
    }

    /// One step of `messages` messages of `s` bytes each way between two
    /// ranks (a share `across` of them between hosts), the rank passing
    /// over what comes in at `rate`: the step's fixed cost and the hop's
    /// latency once, since its messages progress together, then each
    /// message at the pace of the slowest of the rank's pass, the
    /// channel's share of the NIC and its port. Where a rank's transfer
    /// within a host is its own copy, its own message's copy and its pass
    /// over the partner's take turns on its one core.
    fn exchange(&self, messages: f64, s: f64, across: f64, rate: f64) -> f64 {
        let latency = across * self.nic_latency + (1.0 - across) * self.port_latency;
        let own_copy = if self.sender_copies {
            (1.0 - across) * s / (self.port / self.channels)
        } else {
            0.0
        };
        let nic = across * s / (self.nic / self.per_nic());
        let port = (1.0 - across) * s / (self.port / self.channels);
        let each = (s / rate + own_copy + nic).max(nic).max(port);
        self.step + latency + messages * each
    }

    /// The pace of a forwarding pipeline (a ring's) whose hops cross
    /// hosts a share `across` of the time, passing messages of `s` bytes
    /// over at `rate`: see [`Pace`]. Each hop pays the step's fixed cost,
    /// the hop and the pass over the message, unless a link cannot carry
    /// a message per step that fast. A message crosses hosts whole before
    /// the next step can forward it. Where a rank's transfer within a
    /// host is its own copy, the message comes piece by piece: the rank
    /// pays its fixed cost while the message is on its way, and its pass
    /// over a piece is the next piece's transfer. A host's switch moves a
    /// message while the rank pays its step.
    fn pace(&self, s: f64, across: f64, rate: f64) -> Pace {
        let latency = across * self.nic_latency + (1.0 - across) * self.port_latency;
        let nic_share = self.nic / self.per_nic();
        let port_share = self.port / self.channels;
        let nic = if across > 0.0 { s / nic_share } else { 0.0 };
        let port = if across < 1.0 { s / port_share } else { 0.0 };
        if self.sender_copies {
            let within = (1.0 - across) * s.min(self.piece) / port_share;
            let chain = self.step.max(latency) + (s / rate).max(within) + across * s / nic_share;
            return Pace {
                hop: chain,
                turn: 0.0,
                ..self.link_bound(nic, port)
            };
        }
        // A DMA sender forwards each message as its first piece comes in,
        // while the next step's fixed cost runs: the messages go down the
        // ring at a hop (latency, a piece's pass and its transfer at the
        // link's rate) per step. A rank starts a step once the last piece
        // of the step before is in, so the fixed cost, the hop's latency
        // and the whole message's transfer also bound every second step
        // of a rank.
        let piece = s.min(self.piece);
        let moved = |bytes: f64| across * bytes / self.nic + (1.0 - across) * bytes / self.port;
        let cut_through = latency + piece / rate + moved(piece);
        Pace {
            hop: cut_through.max(self.step + s / rate),
            turn: (self.step + latency + 2.0 * piece / rate + moved(s)) / 2.0,
            ..self.link_bound(nic, port)
        }
    }

    /// A pace set by the busier of a channel's NIC (`nic` per message)
    /// and port (`port`): a message per link time, then the last one's
    /// latency past that link.
    fn link_bound(&self, nic: f64, port: f64) -> Pace {
        let tail = if nic >= port {
            self.nic_latency
        } else {
            self.port_latency
        };
        Pace {
            hop: 0.0,
            turn: 0.0,
            link: nic.max(port),
            tail,
        }
    }
}

/// How fast a forwarding pipeline (a ring's) runs: the time per message
/// down the ring, and per step of a rank, which takes one more step than
/// the messages it passes on for each pass around the ring (the step
/// that starts it, or the one that ends it).
#[derive(Clone, Copy)]
struct Pace {
    hop: f64,
    turn: f64,
    /// Where a link cannot carry a message per hop that fast: its time per
    /// message, and the latency of the last message past it.
    link: f64,
    tail: f64,
}

impl Pace {
    /// `loops` passes of `messages` messages each, every rank taking one
    /// step more per pass, after `lead`.
    fn run(self, loops: f64, messages: f64, lead: f64) -> f64 {
        (lead + loops * messages * self.hop)
            .max(lead + loops * messages * self.link + self.tail)
            .max(loops * (messages + 1.0) * self.turn)
    }
}

/// A call as the forms see it: its figures, and the sizes every form
/// starts from.
struct Call {
    f: Figures,
    spec: CollSpec,
    elem_size: usize,
    /// Ranks.
    n: f64,
    /// A rank's bytes, and a channel's share of them.
    bytes: f64,
    per_channel: f64,
    /// The share of a ring's hops on its critical path that cross hosts:
    /// a block's `n - 1` hops enter and leave every host once per channel,
    /// its own host's entry too unless the block starts at the host's
    /// first rank.
    ring_across: f64,
}

/// An algorithm's closed forms: the time of a call past its launch, or
/// `None` for a collective the algorithm has no form for.
type Form = fn(&Call) -> Option<f64>;

/// The table of forms: each built-in algorithm's, in its own file.
///
/// The ordered ring takes the ring's: its schedules are the ring's
/// primitives (the ring's all-reduce loop on pieces cut block first, the
/// ring's reduce-scatter and reduce as they are) on the ring of ranks in
/// index order, one ring for every channel. Every rank sends, receives
/// and reduces the ring's bytes in as many steps; only which block a step
/// carries differs. On hosts of consecutive ranks the index-order ring
/// enters and leaves each host once per channel, as the ring does; on an
/// interleaved placement it crosses hosts more often and the form is low.
fn form(algorithm: Builtin) -> Form {
    match algorithm {
        Builtin::Ring | Builtin::OrderedRing => ring::time,
        Builtin::Direct => direct::time,
        Builtin::Tree => tree::time,
        Builtin::HalvingDoubling => halving_doubling::time,
        Builtin::Hierarchical => hierarchical::time,
        Builtin::OneShot => one_shot::time,
    }
}

/// The closed-form time in microseconds of `algorithm` (a built-in's
/// name) running `spec` with `protocol` and `params` on `cluster`, or
/// `None` for an algorithm or collective it has no form for. A rank alone
/// copies its input to its output, whatever the algorithm.
pub fn estimate_us(
    cluster: &ClusterSpec,
    algorithm: &str,
    spec: &CollSpec,
    elem_size: usize,
    protocol: Protocol,
    params: &Params,
) -> Option<f64> {
    let f = Figures::new(cluster, spec, elem_size, protocol, params);
    let n = f.n;
    let bytes = (spec.count * elem_size) as f64;
    if spec.nranks <= 1 {
        return Some(f.launch + f.step + bytes / f.copy);
    }
    let per_channel = bytes / f.channels;
    let ring_across = if f.hosts > 1.0 {
        (f.hosts / (n - 1.0)).min(1.0)
    } else {
        0.0
    };
    let launch = f.launch;
    let call = Call {
        f,
        spec: *spec,
        elem_size,
        n,
        bytes,
        per_channel,
        ring_across,
    };
    let time = form(Builtin::named(algorithm)?)(&call)?;
    Some(launch + time)
}
