//! Every collective x datatype x op x count, in place and out of place,
//! for 1, 2, 3, 4, 7 and 8 ranks as threads of this process, over shared
//! memory and over TCP sockets.

mod common;

use std::collections::HashMap;

use common::{all_cases, check, tcp_config, test_config, CaseBuffers};
use parking_lot::Mutex;
use rccl::{CollKind, Communicator, Config, DataType, RedOp};

fn run_suite_on_threads(nranks: usize, config: Config) {
    let comms = Communicator::init_all_config(nranks, config).unwrap();
    let cases = all_cases(nranks, &CollKind::ALL, &DataType::ALL);
    let failures = Mutex::new(Vec::<String>::new());
    let all_reduce_outputs = Mutex::new(HashMap::<usize, Vec<Vec<u8>>>::new());
    std::thread::scope(|s| {
        for comm in &comms {
            let (cases, failures, outputs) = (&cases, &failures, &all_reduce_outputs);
            s.spawn(move || {
                let rank = comm.rank();
                for (index, case) in cases.iter().enumerate() {
                    let mut bufs = CaseBuffers::new(case, nranks, rank);
                    if let Err(err) = bufs.run(comm, case) {
                        failures
                            .lock()
                            .push(format!("{case:?} on rank {rank}: {err}"));
                        return;
                    }
                    let out = bufs.output(case, nranks, rank);
                    if let Err(msg) = check(case, nranks, rank, out) {
                        failures.lock().push(msg);
                    }
                    if case.kind == CollKind::AllReduce {
                        outputs.lock().entry(index).or_default().push(out.to_vec());
                    }
                }
            });
        }
    });
    let failures = failures.into_inner();
    assert!(
        failures.is_empty(),
        "{} failures, first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
    for (index, outputs) in all_reduce_outputs.into_inner() {
        assert!(
            outputs.windows(2).all(|w| w[0] == w[1]),
            "{:?}: all-reduce outputs differ between ranks",
            cases[index]
        );
    }
}

#[test]
fn one_rank_shm() {
    run_suite_on_threads(1, test_config());
}

#[test]
fn one_rank_tcp() {
    run_suite_on_threads(1, tcp_config());
}

#[test]
fn two_ranks_shm() {
    run_suite_on_threads(2, test_config());
}

#[test]
fn two_ranks_tcp() {
    run_suite_on_threads(2, tcp_config());
}

#[test]
fn three_ranks_shm() {
    run_suite_on_threads(3, test_config());
}

#[test]
fn three_ranks_tcp() {
    run_suite_on_threads(3, tcp_config());
}

#[test]
fn four_ranks_shm() {
    run_suite_on_threads(4, test_config());
}

#[test]
fn four_ranks_tcp() {
    run_suite_on_threads(4, tcp_config());
}

#[test]
fn seven_ranks_shm() {
    run_suite_on_threads(7, test_config());
}

#[test]
fn seven_ranks_tcp() {
    run_suite_on_threads(7, tcp_config());
}

#[test]
fn eight_ranks_shm() {
    run_suite_on_threads(8, test_config());
}

#[test]
fn eight_ranks_tcp() {
    run_suite_on_threads(8, tcp_config());
}

/// Random floats: order-dependent sums must still be bitwise identical on
/// every rank, and close to the exact sum.
#[test]
fn random_float_all_reduce_is_identical_on_every_rank() {
    let nranks = 5;
    let count = 3 * common::chunk_bytes() / 4 + 11;
    let comms = Communicator::init_all_config(nranks, test_config()).unwrap();
    let input = |rank: usize, i: usize| -> f32 {
        // A fixed pseudo-random sequence (xorshift) per rank.
        let mut x =
            ((rank as u64 + 1) * 0x9E37_79B9_7F4A_7C15) ^ ((i as u64 + 1) * 0xBF58_476D_1CE4_E5B9);
        x ^= x >> 31;
        x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 29;
        (x % 2_000_001) as f32 / 1000.0 - 1000.0
    };
    let results = Mutex::new(vec![(Vec::<f32>::new(), Vec::<half::bf16>::new()); nranks]);
    std::thread::scope(|s| {
        for comm in &comms {
            let results = &results;
            s.spawn(move || {
                let send: Vec<f32> = (0..count).map(|i| input(comm.rank(), i)).collect();
                let mut recv = vec![0f32; count];
                comm.all_reduce(&send, &mut recv, RedOp::Sum).unwrap();
                let mut bf_send: Vec<half::bf16> =
                    send.iter().map(|&v| half::bf16::from_f32(v)).collect();
                comm.all_reduce_in_place(&mut bf_send, RedOp::Sum).unwrap();
                results.lock()[comm.rank()] = (recv, bf_send);
            });
        }
    });
    let results = results.into_inner();
    for w in results.windows(2) {
        assert!(w[0]
            .0
            .iter()
            .zip(&w[1].0)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        assert!(w[0]
            .1
            .iter()
            .zip(&w[1].1)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
    for (i, got) in results[0].0.iter().enumerate() {
        let exact: f64 = (0..nranks).map(|r| f64::from(input(r, i))).sum();
        let bound = 1e-6
            * (0..nranks)
                .map(|r| f64::from(input(r, i)).abs())
                .sum::<f64>()
            + 1e-9;
        assert!(
            (f64::from(*got) - exact).abs() <= bound,
            "element {i}: {got} vs {exact}"
        );
    }
}
