//! A researcher's algorithm in one file: a star all-reduce. Every rank
//! sends its input to rank 0, which folds the inputs in rank order and
//! sends the result back. It is registered by name, checked by the
//! symbolic executor as it registers, and then runs through the
//! all_reduce_perf harness like any built-in algorithm:
//!
//! ```sh
//! NCCL_ALGO=allreduce:star cargo run --release --example star_allreduce -- -b 8 -e 1M -f 4 -g 4
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

use rccl::tuning::register_algorithm;
use rccl_algorithms::{
    split_even, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Step, Topology,
};

/// The star: gather to the center, reduce there, scatter the result back.
struct Star;

const CENTER: Rank = 0;

impl Algorithm for Star {
    fn name(&self) -> &'static str {
        "star"
    }

    fn supports(&self, kind: CollKind) -> bool {
        kind == CollKind::AllReduce
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, _: &Topology) -> Schedule {
        let n = spec.nranks;
        let mut schedule = Schedule::new(params.nchannels);
        for (channel, (offset, len)) in split_even(spec.count, params.nchannels).enumerate() {
            let steps = &mut schedule.channels[channel];
            // Pipelined: each chunk goes in, is reduced, and comes back out.
            let mut at = offset;
            while at < offset + len {
                let piece = params.chunk_elems.min(offset + len - at);
                let (send, recv) = (Slice::send(at, piece), Slice::recv(at, piece));
                if n == 1 {
                    steps.push(Step::one(Prim::Copy {
                        src: send,
                        dst: recv,
                    }));
                } else if rank == CENTER {
                    // Fold every rank's piece into the receive buffer, in
                    // rank order; the center's own input is read through
                    // the send buffer (which applies the op's input
                    // transform) by the first fold.
                    for peer in 1..n {
                        let src = if peer == 1 { send } else { recv };
                        let prim = if peer + 1 < n {
                            Prim::RecvReduceCopyPartial {
                                from: peer,
                                src,
                                dst: recv,
                            }
                        } else {
                            Prim::RecvReduceCopy {
                                from: peer,
                                src,
                                dst: recv,
                            }
                        };
                        steps.push(Step::one(prim));
                    }
                    let back = (1..n).map(|to| Prim::Send { to, src: recv }).collect();
                    steps.push(Step { prims: back });
                } else {
                    steps.push(Step::one(Prim::Send {
                        to: CENTER,
                        src: send,
                    }));
                    steps.push(Step::one(Prim::Recv {
                        from: CENTER,
                        dst: recv,
                    }));
                }
                at += piece;
            }
        }
        schedule
    }
}

fn main() -> std::process::ExitCode {
    if let Err(err) = register_algorithm(&Star) {
        eprintln!("{err}");
        return std::process::ExitCode::FAILURE;
    }
    rccl_tests::perf::main(rccl_tests::perf::Coll::AllReduce)
}
