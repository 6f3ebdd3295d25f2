//! Halving-doubling's all-reduce: the extra ranks' fold, then the rounds
//! of exchanges along the ways of a rank with an extra rank folded in and
//! of one without ([`Way`]), against what the hosts' NICs carry of them.

use rccl_algorithms::CollKind;

use super::{Call, Figures};

pub(super) fn time(call: &Call) -> Option<f64> {
    match call.spec.kind {
        CollKind::AllReduce => Some(all_reduce(call)),
        _ => None,
    }
}

fn all_reduce(call: &Call) -> f64 {
    let Call {
        ref f,
        ref spec,
        elem_size,
        n,
        bytes,
        per_channel,
        ring_across,
    } = *call;
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
            f.exchange(messages, s, share, f.reduce) + f.exchange(messages, s, share, f.copy)
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
            other.time(f).max(folded.time(f) - hidden)
        }
        None => other.time(f),
    };
    fold + rounds
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
