//! The researcher's path: algorithms registered by name and schedule files
//! loaded at run time are checked by the symbolic executor before anything
//! runs, and a wrong one is refused naming its first bad step.

use std::process::Command;

use rccl::tuning::register_algorithm;
use rccl::{Communicator, Config};
use rccl_algorithms::{
    Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Step, Topology,
};

/// A ring-less "all-reduce" that only copies its own input: wrong for
/// every rank count above one.
struct CopyOnly;

impl Algorithm for CopyOnly {
    fn name(&self) -> &'static str {
        "copyonly"
    }
    fn supports(&self, kind: CollKind) -> bool {
        kind == CollKind::AllReduce
    }
    fn schedule(&self, spec: &CollSpec, _: Rank, params: &Params, _: &Topology) -> Schedule {
        let mut schedule = Schedule::new(params.nchannels);
        if spec.count > 0 {
            schedule.channels[0].push(Step::one(Prim::Copy {
                src: Slice::send(0, spec.count),
                dst: Slice::recv(0, spec.count),
            }));
        }
        schedule
    }
}

#[test]
fn a_wrong_algorithm_is_refused_at_registration_naming_the_problem() {
    let err = register_algorithm(&CopyOnly).unwrap_err().to_string();
    assert!(err.contains("copyonly") && err.contains("2 ranks"), "{err}");
    // It never became selectable.
    assert!(rccl::tuning::algorithms()
        .iter()
        .all(|a| a.name() != "copyonly"));
}

const CHILD: &str = "RCCL_PLUGIN_CHILD";

/// Started by the test below with `RCCL_SCHEDULE_FILES` set.
#[test]
fn child_loads_schedule_files() {
    let Ok(expect) = std::env::var(CHILD) else {
        return;
    };
    let result = Communicator::init_all_config(4, Config::default());
    match expect.as_str() {
        "good" => {
            let comms = result.unwrap();
            assert!(rccl::tuning::algorithms()
                .iter()
                .any(|a| a.name() == "ring4"));
            let outputs: Vec<Vec<f32>> = std::thread::scope(|s| {
                let handles: Vec<_> = comms
                    .iter()
                    .map(|comm| {
                        s.spawn(move || {
                            let mut out = vec![0f32; 64];
                            comm.all_reduce(&[comm.rank() as f32; 64], &mut out, rccl::RedOp::Sum)
                                .unwrap();
                            out
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert!(outputs.iter().all(|o| o.iter().all(|&v| v == 6.0)));
        }
        _ => {
            let err = result.unwrap_err().to_string();
            println!("refused: {err}");
            assert!(
                err.contains("wrong_ring_allreduce_4") && err.contains("step"),
                "{err}"
            );
        }
    }
}

fn run_child(file: &str, expect: &str, algo: &str) {
    let path = format!("{}/algorithms/schedules/{file}", env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_loads_schedule_files", "--nocapture"])
        .env(CHILD, expect)
        .env("RCCL_SCHEDULE_FILES", path)
        .env("NCCL_ALGO", algo)
        .status()
        .unwrap();
    assert!(status.success(), "{file}");
}

#[test]
fn a_schedule_file_loads_runs_and_a_wrong_one_is_refused() {
    run_child("ring_allreduce_4.json", "good", "allreduce:ring4");
    run_child("wrong_ring_allreduce_4.json", "bad", "allreduce:ring");
}
