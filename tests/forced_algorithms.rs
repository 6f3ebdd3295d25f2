//! The correctness suite with each algorithm forced through `NCCL_ALGO`'s
//! per-collective syntax, for every collective it implements, on ranks as
//! threads of one process.

mod common;

use common::{all_cases, suite_on_threads, test_config};
use rccl::tuning::{Selection, BOARD_ALGORITHM};
use rccl::{CollKind, Communicator, Config, DataType};

fn run_forced(name: &str, nranks: usize, board_bytes: usize) {
    run_forced_with(name, nranks, board_bytes, test_config().nt_store_bytes);
}

/// `run_forced` with calls of at least `nt_store_bytes` per rank writing
/// the user's buffers with non-temporal stores.
fn run_forced_with(name: &str, nranks: usize, board_bytes: usize, nt_store_bytes: usize) {
    let algorithm = rccl_algorithms::builtin(name).unwrap();
    let kinds: Vec<CollKind> = CollKind::ALL
        .into_iter()
        .filter(|&k| algorithm.supports(k))
        .collect();
    let rule = kinds
        .iter()
        .map(|k| format!("{}:{name}", k.name().to_ascii_lowercase()))
        .collect::<Vec<_>>()
        .join(";");
    let config = Config {
        algo: Selection::parse("NCCL_ALGO", &rule).unwrap(),
        board_bytes,
        nt_store_bytes,
        ..test_config()
    };
    // Calls that fit the board may also run one-shot in place.
    let on_board = |c: &common::Case| {
        name == BOARD_ALGORITHM
            && nranks > 1
            && c.kind == CollKind::AllReduce
            && c.count * c.dtype.size() <= board_bytes
    };
    let cases: Vec<_> = all_cases(nranks, &kinds, &DataType::ALL)
        .into_iter()
        .filter(|c| !c.in_place || algorithm.supports_in_place(c.kind) || on_board(c))
        .collect();
    let failures = suite_on_threads(nranks, config, &cases);
    assert!(
        failures.is_empty(),
        "{name} on {nranks} ranks (board {board_bytes} bytes, streaming from \
         {nt_store_bytes} bytes): {} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
}

#[test]
fn every_builtin_algorithm_passes_the_suite() {
    for algorithm in rccl_algorithms::builtins() {
        for nranks in [1, 2, 3, 5, 8] {
            run_forced(algorithm.name(), nranks, test_config().board_bytes);
        }
    }
}

/// Every call of the suite writes the user's buffers with non-temporal
/// stores (the streaming path of every primitive, at every alignment the
/// suite's offsets give).
#[test]
fn every_builtin_algorithm_passes_the_suite_with_streaming_stores() {
    for algorithm in rccl_algorithms::builtins() {
        for nranks in [2, 3, 5] {
            run_forced_with(algorithm.name(), nranks, 0, 1);
        }
    }
}

#[test]
fn one_shot_passes_the_suite_through_fifos_and_through_a_small_board() {
    for nranks in [2, 3, 5, 8] {
        // No board: every call through the per-pair FIFOs.
        run_forced(BOARD_ALGORITHM, nranks, 0);
        // A board smaller than the largest calls: both paths in one run.
        run_forced(BOARD_ALGORITHM, nranks, 1024);
    }
}

/// Random floats reduced one-shot through the board and through FIFOs:
/// the same order of operations, so the same bits on every rank.
#[test]
fn one_shot_gives_the_same_bits_through_the_board_and_through_fifos() {
    let nranks = 5;
    let count = 999;
    let inputs: Vec<Vec<f32>> = (0..nranks)
        .map(|r| {
            (0..count)
                .map(|i| ((r * 7919 + i * 104_729) % 10_007) as f32 / 977.0 - 5.0)
                .collect()
        })
        .collect();
    let run = |board_bytes: usize| -> Vec<Vec<f32>> {
        let config = Config {
            algo: Selection::parse("NCCL_ALGO", BOARD_ALGORITHM).unwrap(),
            board_bytes,
            ..test_config()
        };
        let comms = Communicator::init_all_config(nranks, config).unwrap();
        std::thread::scope(|s| {
            let handles: Vec<_> = comms
                .iter()
                .zip(&inputs)
                .map(|(comm, input)| {
                    s.spawn(move || {
                        let mut out = vec![0f32; count];
                        comm.all_reduce(input, &mut out, rccl::RedOp::Sum).unwrap();
                        out
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    };
    let (board, fifos) = (run(64 << 10), run(0));
    for rank in 0..nranks {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&board[rank]), bits(&board[0]), "rank {rank} (board)");
        assert_eq!(bits(&fifos[rank]), bits(&board[0]), "rank {rank} (FIFOs)");
    }
}

#[test]
fn an_in_place_call_never_gets_an_algorithm_that_cannot_do_it() {
    let config = Config {
        algo: Selection::parse("NCCL_ALGO", "allreduce:oneshot").unwrap(),
        ..test_config()
    };
    let comms = Communicator::init_all_config(1, config.clone()).unwrap();
    let err = comms[0]
        .all_reduce_in_place(&mut [1f32; 4], rccl::RedOp::Sum)
        .unwrap_err();
    assert!(err.to_string().contains("in place"), "{err}");
    // With peers on this host, a call that fits the board runs one-shot in
    // place through it; a larger one is refused.
    let config = Config {
        board_bytes: 64,
        ..config
    };
    let comms = Communicator::init_all_config(2, config).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let mut fits = [comm.rank() as f32 + 1.0; 16];
                comm.all_reduce_in_place(&mut fits, rccl::RedOp::Sum)
                    .unwrap();
                assert_eq!(fits, [3.0; 16]);
                let err = comm
                    .all_reduce_in_place(&mut [1f32; 17], rccl::RedOp::Sum)
                    .unwrap_err();
                assert!(err.to_string().contains("in place"), "{err}");
            });
        }
    });
}
