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
//! [`simulate`]: crate::simulate

use rccl_algorithms::{CollKind, CollSpec, Params};

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

/// The rounds of halving-doubling along one rank's way: the chain of its
/// exchanges, and what the host's NICs see of them: the crossing rounds
/// in the halving's order (how long the busiest host's NICs take over
/// each, and over its first message) and the time of the rounds within
/// hosts.
struct Way {
    chain: f64,
    within: f64,
    crossing: [(f64, f64); usize::BITS as usize],
    crossed: usize,
}

impl Way {
    fn new() -> Way {
        Way {
            chain: 0.0,
            within: 0.0,
            crossing: [(0.0, 0.0); usize::BITS as usize],
            crossed: 0,
        }
    }

    /// A round of `time` on the chain; where it crosses hosts, the NICs'
    /// `(drain, stagger)`: their time over the round and its first
    /// message, and the wait of the last message behind the others, which
    /// the first crossing round adds to the chain.
    fn round(&mut self, time: f64, crossing: Option<((f64, f64), f64)>) {
        self.chain += time;
        match crossing {
            Some((drain, stagger)) => {
                if self.crossed == 0 {
                    self.chain += stagger;
                }
                self.crossing[self.crossed] = drain;
                self.crossed += 1;
            }
            None => self.within += time,
        }
    }

    /// The way's time: its chain, or the host's NICs carrying the
    /// crossing rounds back to back, whichever is longer. A round starts
    /// on the NICs once the round before has drained, or, if the NICs
    /// drain faster, once the first pair's messages of the round before
    /// are in and its next step has begun. The doubling runs the crossing
    /// rounds in reverse; the rounds within hosts and the last message's
    /// latency each way come on top.
    fn time(&self, f: &Figures) -> f64 {
        let crossing = &self.crossing[..self.crossed];
        if crossing.is_empty() {
            return self.chain;
        }
        let drain = |rounds: &mut dyn Iterator<Item = &(f64, f64)>| {
            let (mut start, mut end, mut first) = (0.0f64, 0.0f64, None);
            for &(time, message) in rounds {
                if let Some(before) = first {
                    start = end.max(start + before + f.nic_latency + f.step);
                }
                end = start + time;
                first = Some(message);
            }
            end
        };
        let nic = drain(&mut crossing.iter())
            + drain(&mut crossing.iter().rev())
            + self.within
            + 2.0 * f.nic_latency;
        self.chain.max(nic)
    }
}

/// Above this many ranks taking part, halving-doubling's form reads which
/// rounds cross hosts off the distance alone rather than rank by rank.
const RHD_WALKED_RANKS: usize = 1024;

/// The closed-form time in microseconds of `algorithm` (a built-in's
/// name) running `spec` with `protocol` and `params` on `cluster`, or
/// `None` for an algorithm or collective it has no form for.
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
        // A rank alone copies its input to its output.
        return Some(f.launch + f.step + bytes / f.copy);
    }
    let per_channel = bytes / f.channels;
    // The share of a ring's hops on its critical path that cross hosts:
    // a block's `n - 1` hops enter and leave every host once per channel,
    // its own host's entry too unless the block starts at the host's
    // first rank.
    let ring_across = if f.hosts > 1.0 {
        (f.hosts / (n - 1.0)).min(1.0)
    } else {
        0.0
    };
    let kind = spec.kind;
    let time = match (algorithm, kind) {
        ("ring", CollKind::AllReduce) => {
            let loops = (per_channel / (n * f.chunk)).ceil().max(1.0);
            let s = (per_channel / (n * loops)).max(1.0);
            // Reduce-scatter steps, then all-gather steps that also keep
            // what passes, as one pass around the ring per loop.
            let (reduce, copy) = (
                f.pace(s, ring_across, f.reduce),
                f.pace(s, ring_across, f.copy),
            );
            Pace {
                hop: (reduce.hop + copy.hop + f.kept(s, ring_across)) / 2.0,
                turn: (reduce.turn + copy.turn) / 2.0,
                link: (reduce.link + copy.link) / 2.0,
                tail: reduce.tail,
            }
            .run(loops, 2.0 * (n - 1.0), f.lead())
        }
        ("ring", CollKind::AllGather | CollKind::ReduceScatter) => {
            let loops = (per_channel / f.chunk).ceil().max(1.0);
            let s = (per_channel / loops).max(1.0);
            let pace = if kind == CollKind::ReduceScatter {
                f.pace(s, ring_across, f.reduce)
            } else {
                let copy = f.pace(s, ring_across, f.copy);
                Pace {
                    hop: copy.hop + f.kept(s, ring_across),
                    ..copy
                }
            };
            pace.run(loops, n - 1.0, f.lead())
        }
        ("ring", CollKind::Broadcast | CollKind::Reduce) => {
            let rate = if kind == CollKind::Reduce {
                f.reduce
            } else {
                f.copy
            };
            let nic_bytes = if f.hosts > 1.0 { bytes } else { 0.0 };
            // A chain from the root: it crosses into each other host once.
            let across = (f.hosts - 1.0) / (n - 1.0);
            // A broadcast's rank keeps what it passes on: where its
            // transfers within a host are its own copies, the copy into
            // its own buffer follows each transfer on the same core, as
            // many bytes again at the copy rate.
            let kept = if kind == CollKind::Broadcast {
                f.kept(bytes, across) * f.port
            } else {
                0.0
            };
            f.pipeline(
                n - 1.0,
                across,
                per_channel,
                1.0,
                rate,
                nic_bytes,
                bytes + kept,
            )
        }
        ("tree", CollKind::AllReduce) => {
            // A chain of each host's ranks under a binary tree of hosts
            // (one binary tree of ranks within a host).
            let across_depth = if f.hosts > 1.0 {
                f.hosts.log2().ceil()
            } else {
                0.0
            };
            let chain_depth = if f.hosts > 1.0 {
                f.local - 1.0
            } else {
                n.log2().ceil()
            };
            let depth = across_depth + chain_depth;
            let across = across_depth / depth;
            // A host's head takes in and sends out a channel's bytes once
            // per edge of the tree of hosts at it: its parent and up to
            // two children (two from 4 hosts on, one on 3, and over two
            // hosts each is the other's only neighbour). Where a NIC
            // carries channels of both trees (channels `c` and `c + k` on
            // one rail), a host interior in one is a leaf in the other:
            // two channels' bytes each way per pair.
            let edges: f64 = match f.hosts {
                h if h > 3.0 => 3.0,
                h if h > 2.0 => 2.0,
                h if h > 1.0 => 1.0,
                _ => 0.0,
            };
            let channel_loads = if f.per_nic() >= 2.0 {
                edges.min(2.0) * f.per_nic()
            } else {
                edges
            };
            let nic_bytes = channel_loads * per_channel * f.rails.min(f.channels);
            // A rank reduces each chunk going up and copies it coming down,
            // once per child, a step each, and the busiest rank sets the
            // pace: within a host the binary tree's inner ranks have two
            // (from 3 ranks on); across hosts a host's head has the next
            // rank of its chain and, in the tree of hosts, up to two heads
            // of other hosts (two from 4 hosts on: below that no host has
            // two).
            let host_children = if f.hosts > 3.0 { 2.0 } else { 1.0 };
            let children = if f.hosts > 1.0 {
                let chain = if f.local > 1.0 { 1.0 } else { 0.0 };
                chain + host_children
            } else if n < 3.0 {
                1.0
            } else {
                2.0
            };
            let rate = 1.0 / (children / f.reduce + children / f.copy);
            if f.channels < 2.0 && f.hosts > 1.0 {
                // One channel runs both trees on half the data each, every
                // phase after the other at each rank: up tree 0, up tree 1,
                // down tree 0, down tree 1. A tree's root is a leaf of the
                // other, deepest where the first tree is shallow: the last
                // result leaves the root of tree 1 once tree 0's way up
                // and down has reached it, three crossings of the tree of
                // hosts in all, after the chain's way up (the chains are
                // the same in both trees) and before its way down.
                let half = per_channel / 2.0;
                let (chunks, s) = f.chunk_of(half);
                let piece = s.min(f.piece);
                // A chain's rank reduces a piece going up, copies it coming
                // down.
                let chain =
                    chain_depth * (f.within_hop(piece, f.reduce) + f.within_hop(piece, f.copy));
                // A crossing reduces the piece going up, copies it coming
                // down. Below the root, which has one child host, a head
                // takes in its child hosts' pieces a step each going up,
                // the second behind the first on its NIC; going down it
                // passes the piece to its chain in one step, then to its
                // child hosts in the next, one after the other on its NIC.
                let below_root = (across_depth - 1.0).max(0.0);
                let second = if host_children > 1.0 {
                    piece / f.nic
                } else {
                    0.0
                };
                let crossings = 3.0 * across_depth * f.hop(piece, true)
                    + across_depth * piece / f.reduce
                    + 2.0 * across_depth * piece / f.copy
                    + below_root * (f.step.max(second) + 2.0 * (f.step + second));
                // The other chunks follow at the pace of the busiest rank
                // or link. The head's steps over a chunk: up tree 0, then
                // down tree 0 and down tree 1 on the way to the last
                // result (tree 1's way up runs beside tree 0's). A head's
                // NIC, in each direction, carries a chunk per child host
                // in the phases where it is interior, and the other
                // tree's chunk before its next phase can start (tree 0's
                // root sends tree 1's way up before tree 0's way down): a
                // chunk per child host in each of the four phases. A
                // chain's rank takes a chunk in over its port per phase.
                let up = children * f.step + s / (f.reduce / children);
                let down = children.min(2.0) * f.step + s / (f.copy / children);
                let phases = (chunks - 1.0)
                    * (up + 2.0 * down)
                        .max(4.0 * host_children * s / f.nic)
                        .max(4.0 * s / f.port);
                f.step + chain + crossings + phases
            } else if f.channels < 2.0 {
                // Within one host the two trees differ rank by rank: the
                // first piece crosses three times their depth, then each
                // phase runs at the pace of its busiest rank, an inner rank
                // taking in both children's halves over its port.
                let half = per_channel / 2.0;
                let piece = f.chunk_of(half).1.min(f.piece);
                let fill = f.fill(3.0 * depth, 0.0, piece, rate);
                let phase_port = children * bytes / 2.0;
                let phase =
                    |steps: f64, rate: f64| f.stream(half, across, steps, rate, 0.0, phase_port);
                fill + 2.0 * phase(children, f.reduce / children)
                    + 2.0 * phase(children.min(2.0), f.copy / children)
            } else {
                // One tree per channel runs the way down a lag behind the
                // way up, two chunks more per level: a rank passes chunk
                // `j` down in the steps where it reduces chunk `j + 1 + 2d`
                // at depth `d`. A chunk a head sends up at the start of a
                // step crosses the `k` levels of the tree of hosts to the
                // root and back, each level a crossing each way and the
                // head's steps over a chunk (one per child), before the
                // head can end the step that passes it on, `2k + 2` chunks
                // later: each chunk takes at least that round trip's
                // share.
                let (chunks, s) = f.chunk_of(per_channel);
                let round_trip = if f.hosts > 1.0 {
                    across_depth * (2.0 * f.hop(s, true) + children * (f.step + s / f.reduce))
                        / (2.0 * across_depth + 2.0)
                } else {
                    0.0
                };
                f.fill(2.0 * depth, across, s.min(f.piece), rate)
                    + f.stream(per_channel, across, children, rate, nic_bytes, 2.0 * bytes)
                        .max(chunks * round_trip)
            }
        }
        ("tree", CollKind::Broadcast) => {
            // A binary tree over ranks from the root: the first piece's way
            // down its deepest branch, `ceil(log2 n)` edges that halve the
            // distance between parent and child at each level, every rank
            // past the root's only child serving its second child a step
            // after its first. An edge spanning a host's ranks or more
            // crosses hosts; of the shorter ones, one does where the
            // branch steps over a host's edge.
            let chunks = (per_channel / f.chunk).ceil().max(1.0);
            let s = (per_channel / chunks).max(1.0);
            let piece = s.min(f.piece);
            let levels = n.log2().ceil();
            let long = if f.hosts > 1.0 {
                (levels - f.local.log2().ceil()).max(0.0)
            } else {
                0.0
            };
            let crossing = if f.hosts > 1.0 {
                (long + 1.0).min(levels)
            } else {
                0.0
            };
            let fill = levels * piece / f.copy
                + crossing * f.hop(piece, true)
                + (levels - crossing) * f.hop(piece, false)
                + (levels - 1.0) * f.step;
            // A host's NICs carry what its ranks send to their children on
            // other hosts. With hosts of m ranks (m a power of two), rank
            // 2m is the first whose two children both live elsewhere
            // (2m - m and 2m + m), which needs a fourth host; below that
            // every host sends the data out once at most.
            let nic_bytes = match f.hosts {
                h if h > 3.0 => 2.0 * bytes,
                h if h > 1.0 => bytes,
                _ => 0.0,
            };
            let stage = chunks * (f.step + s / f.copy);
            // A rank sends to two children over its port, and keeps what
            // it passes on: on the same core where its transfers are its
            // own copies.
            f.step
                + fill
                + stage
                    .max(nic_bytes / f.nic_total())
                    .max(2.0 * bytes / f.port + f.kept(bytes, 0.0))
        }
        ("hier", CollKind::AllReduce) => {
            // Reduce-scatter rings inside each host, all-reduce rings across
            // hosts on a share `1/local` of the data (the host's rings on
            // the channel's NIC), all-gather rings inside, one phase after
            // the other.
            let (m, h) = (f.local, f.hosts);
            let inner = if m > 1.0 {
                f.ring_steps(m - 1.0, per_channel / m, 0.0, f.reduce, false)
                    + f.ring_steps(m - 1.0, per_channel / m, 0.0, f.copy, true)
            } else {
                0.0
            };
            let outer = if h > 1.0 {
                let block = per_channel / (m * h);
                let chain = f.ring_steps(2.0 * (h - 1.0), block, 1.0, f.reduce, false);
                chain.max(f.rail_rings(2.0 * (h - 1.0) * block * m))
            } else {
                0.0
            };
            inner + outer
        }
        ("hier", CollKind::AllGather | CollKind::ReduceScatter) => {
            // Rail rings across hosts move each rank's block, rings inside
            // each host the hosts' blocks.
            let (m, h) = (f.local, f.hosts);
            let rate = if kind == CollKind::AllGather {
                f.copy
            } else {
                f.reduce
            };
            // Inside, a step passes on one message per host's block.
            let inner = if m > 1.0 {
                h * f.ring_steps(m - 1.0, per_channel, 0.0, rate, kind == CollKind::AllGather)
            } else {
                0.0
            };
            let outer = if h > 1.0 {
                let chain = f.ring_steps(h - 1.0, per_channel, 1.0, rate, false);
                chain.max(f.rail_rings((h - 1.0) * per_channel * m))
            } else {
                0.0
            };
            // Reduce-scatter reduces inside a host one host's block at a
            // time while the rail rings carry the blocks reduced before:
            // a pipeline of two stages over `h` blocks. Where a rank's
            // transfers are its own copies, the stages share its core: the
            // first block goes through both, the others at the slower
            // stage's pace; a DMA engine hides all but the slower stage.
            if kind == CollKind::ReduceScatter {
                let fill = if f.sender_copies {
                    inner.min(outer) / h
                } else {
                    0.0
                };
                // With one channel of such ranks, the stages also wait
                // on each other: the host's ring for the next block needs
                // every rank's rail message, which the host's NIC
                // delivers one after another, and the NIC's next round
                // waits for the host's ring. Each round takes the ring
                // and all but one of the host's messages on the NIC.
                // (With more channels, one channel's ring runs while
                // another's messages wait.)
                let lockstep = if f.sender_copies && f.channels < 2.0 && h > 1.0 && m > 1.0 {
                    inner + (m - 1.0) * (h - 1.0) * per_channel / f.nic_total()
                } else {
                    0.0
                };
                (inner.max(outer) + fill).max(lockstep)
            } else {
                inner + outer
            }
        }
        ("rhd", CollKind::AllReduce) => {
            let rounds = n.log2().floor();
            let p = 2f64.powf(rounds);
            // Extra ranks fold their whole input in first and take the
            // result back last, over a NIC where their partner is on
            // another host.
            let fold = if p < n {
                let nic_bytes = if f.hosts > 1.0 { bytes } else { 0.0 };
                2.0 * f.pipeline(
                    1.0,
                    ring_across,
                    per_channel,
                    1.0,
                    f.reduce,
                    nic_bytes,
                    bytes,
                )
            } else {
                0.0
            };
            // Round i exchanges half of what a rank holds with the rank
            // `p / 2^(i+1)` away in the numbering of the ranks taking part,
            // across hosts where that partner lives on another host (the
            // extra ranks fold into their neighbours, so the numbering
            // packs the first hosts' ranks closer); the rounds run again
            // in reverse to gather.
            let extra = spec.nranks - p as usize;
            let real = |v: usize| {
                if v < extra {
                    2.0 * v as f64 + 1.0
                } else {
                    (v + extra) as f64
                }
            };
            let host = |r: f64| (r / f.local).floor();
            // Where every rank takes part and hosts hold a power of two of
            // ranks, a round crosses hosts exactly when its distance
            // reaches a host's ranks, all of a host's ranks at once (the
            // pairs left without elements of tiny calls move next to
            // nothing). Other shapes are walked rank by rank, following
            // the elements of the region each pair splits (a pair whose
            // region is empty exchanges nothing), up to
            // `RHD_WALKED_RANKS`, past which the rule above stands for
            // them too, so that a decision stays within microseconds.
            let elems = (per_channel / elem_size as f64).floor();
            let regular = extra == 0 && (f.local as usize).is_power_of_two();
            let walk = f.hosts > 1.0 && !regular && p as usize <= RHD_WALKED_RANKS;
            let mut region = if walk {
                vec![elems; p as usize]
            } else {
                Vec::new()
            };
            // The rounds along the way of a rank without an extra rank
            // folded in, and, where there are extra ranks, of one with.
            let mut other = Way::new();
            let mut folded = (p < n).then(Way::new);
            let mut first_latency = 0.0;
            let mut held = per_channel;
            let mut mask = p as usize / 2;
            for _ in 0..rounds as usize {
                held = (held / 2.0).max(elem_size as f64);
                // The most ranks of one host that cross in this round, and
                // whether a rank with an extra rank folded in crosses, and
                // one without.
                let (crossers, folded_cross, other_cross) = if walk {
                    let (mut most, mut on_host, mut current) = (0.0f64, 0.0, -1.0);
                    let (mut folded_cross, mut other_cross) = (false, false);
                    for (v, len) in region.iter_mut().enumerate() {
                        let (a, b) = (real(v), real(v ^ mask));
                        if host(a) != current {
                            current = host(a);
                            on_host = 0.0;
                        }
                        if *len >= 1.0 && host(a) != host(b) {
                            on_host += 1.0;
                            most = most.max(on_host);
                            if v < extra {
                                folded_cross = true;
                            } else {
                                other_cross = true;
                            }
                        }
                        let half = (*len / 2.0).floor();
                        *len = if v & mask == 0 { half } else { *len - half };
                    }
                    (most, folded_cross, other_cross)
                } else if f.hosts > 1.0 && mask as f64 >= f.local {
                    (f.local, true, true)
                } else {
                    (0.0, false, false)
                };
                let messages = (held / f.chunk).ceil().max(1.0);
                let s = held / messages;
                // Halving reduces what comes in, doubling only copies it.
                let round = |crosses: bool| {
                    let share = if crosses { 1.0 } else { 0.0 };
                    f.exchange(messages, s, share, f.reduce)
                        + f.exchange(messages, s, share, f.copy)
                };
                // Every crossing rank of a host sends at once: the busiest
                // host's NICs take this long over the round, and over its
                // first message. In the halving's first crossing round the
                // last message waits behind the others; later rounds find
                // the ranks staggered by it.
                let drain = (held * crossers * f.channels / f.nic_total(), s / f.nic);
                let stagger = (crossers - 1.0).max(0.0) * held * f.channels / f.nic_total();
                if mask == p as usize / 2 {
                    first_latency = if folded_cross {
                        f.nic_latency
                    } else {
                        f.port_latency
                    };
                }
                other.round(round(other_cross), other_cross.then_some((drain, stagger)));
                if let Some(folded) = &mut folded {
                    folded.round(
                        round(folded_cross),
                        folded_cross.then_some((drain, stagger)),
                    );
                }
                mask /= 2;
            }
            // Every rank waits for the fold, through its partners. A rank
            // with an extra rank folded in takes its first round's message
            // in while it folds (its partner sends at once), and likewise
            // its last round's while the result goes back: each pass of
            // the fold, beyond its step's fixed cost, hides up to that
            // round's latency on its way only.
            let rounds = match folded {
                Some(folded) => {
                    let hidden = 2.0 * (fold / 2.0 - f.step).max(0.0).min(first_latency);
                    other.time(&f).max(folded.time(&f) - hidden)
                }
                None => other.time(&f),
            };
            fold + rounds
        }
        ("oneshot", CollKind::AllReduce) => {
            // Every rank sends its input to every other and reduces all n.
            let chunks = (per_channel / f.chunk).ceil().max(1.0);
            let s = per_channel / chunks;
            let out_nic =
                f.local * (n - f.local) * s / (f.nic * f.rails.min(f.channels) / f.channels);
            let out_port = (n - 1.0) * s / (f.port / f.channels);
            // Each of the n inputs joins the accumulator in a step of its
            // own, in one order on every rank, after the inputs are in:
            // within a host a rank's port takes them in one after the
            // other (a rank whose transfers are its own copies makes them
            // on the same core, before its reductions). Across hosts the
            // inputs join in one order on every rank while each rank sends
            // in its own, so some rank's first input is the last its
            // sender's NICs carry: its reductions start once they drain.
            let step = n * f.step + (n - 1.0) * s / f.reduce;
            let step = if f.hosts > 1.0 {
                step + out_nic
            } else {
                step + out_port
            };
            chunks * step.max(out_nic).max(out_port) + f.arrival(s, f.hosts > 1.0)
        }
        ("direct", CollKind::AllToAll | CollKind::Gather | CollKind::Scatter) => {
            let chunks = (per_channel / f.chunk).ceil().max(1.0);
            let s = per_channel / chunks;
            let out_port = (n - 1.0) * s / (f.port / f.channels);
            let remote = if f.hosts > 1.0 {
                f.local * (n - f.local) * s / (f.nic * f.rails)
            } else {
                0.0
            };
            chunks * (f.step + s / f.copy).max(out_port).max(remote) + f.arrival(s, f.hosts > 1.0)
        }
        _ => return None,
    };
    Some(f.launch + time)
}
