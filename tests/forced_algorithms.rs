//! The correctness suite with each algorithm forced through `NCCL_ALGO`'s
//! per-collective syntax, for every collective it implements, on ranks as
//! threads of one process.

mod common;

use common::{all_cases, suite_on_threads, test_config};
use rccl::tuning::Selection;
use rccl::{CollKind, Communicator, Config, DataType};

fn run_forced(name: &str, nranks: usize) {
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
        ..test_config()
    };
    let cases: Vec<_> = all_cases(nranks, &kinds, &DataType::ALL)
        .into_iter()
        .filter(|c| !c.in_place || algorithm.supports_in_place(c.kind))
        .collect();
    let failures = suite_on_threads(nranks, config, &cases);
    assert!(
        failures.is_empty(),
        "{name} on {nranks} ranks: {} failures:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
}

#[test]
fn every_builtin_algorithm_passes_the_suite() {
    for algorithm in rccl_algorithms::builtins() {
        for nranks in [1, 2, 3, 5, 8] {
            run_forced(algorithm.name(), nranks);
        }
    }
}

#[test]
fn an_in_place_call_never_gets_an_algorithm_that_cannot_do_it() {
    let config = Config {
        algo: Selection::parse("NCCL_ALGO", "allreduce:oneshot").unwrap(),
        ..test_config()
    };
    let comms = Communicator::init_all_config(1, config).unwrap();
    let err = comms[0]
        .all_reduce_in_place(&mut [1f32; 4], rccl::RedOp::Sum)
        .unwrap_err();
    assert!(err.to_string().contains("in place"), "{err}");
}
