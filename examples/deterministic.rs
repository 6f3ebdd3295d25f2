//! Deterministic reductions: four ranks all-reduce the same f32 data under
//! two algorithm selections (`NCCL_ALGO=ring`, `NCCL_ALGO=tree`) with the
//! deterministic mode on, get the same bits from both, and those bits are
//! what `rccl::deterministic::reference` computes serially on one CPU.
//! Without the mode the two selections may round differently, as a float
//! sum depends on its order. Exits non-zero when the bits differ.
//!
//! ```sh
//! cargo run --release --example deterministic
//! ```

use std::process::ExitCode;

use rccl::tuning::Selection;
use rccl::{deterministic, CollKind, Communicator, Config, RedOp};

const NRANKS: usize = 4;
/// Elements per rank: 256 KiB, past the board, so the mode runs the
/// ordered ring in place of the ring or the tree.
const COUNT: usize = 1 << 16;

/// Rank `rank`'s input: values of mixed sign and magnitude, whose sum
/// rounds differently in different orders.
fn input(rank: usize) -> Vec<f32> {
    let mut state = 0x9e37_79b9_u32.wrapping_mul(rank as u32 + 1);
    (0..COUNT)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let mantissa = (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            mantissa * 10f32.powi((state % 7) as i32 - 3)
        })
        .collect()
}

/// Every rank's result of a sum all-reduce of `inputs`, the ranks as
/// threads of this process.
fn all_reduce(inputs: &[Vec<f32>], config: Config) -> Result<Vec<Vec<f32>>, rccl::Error> {
    let comms = Communicator::init_all_config(inputs.len(), config)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .zip(inputs)
            .map(|(comm, send)| {
                s.spawn(move || {
                    let mut recv = vec![0f32; send.len()];
                    comm.all_reduce(send, &mut recv, RedOp::Sum).map(|()| recv)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// The settings with `NCCL_ALGO=algo` and the mode on or off, over those
/// of the environment.
fn config(algo: &str, deterministic: bool) -> Result<Config, rccl::Error> {
    Ok(Config {
        algo: Selection::parse("NCCL_ALGO", algo)?,
        deterministic,
        ..Config::from_env()?
    })
}

/// Elements whose bits differ between `a` and `b`.
fn differing(a: &[f32], b: &[f32]) -> usize {
    a.iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count()
}

fn main() -> Result<ExitCode, rccl::Error> {
    let inputs: Vec<Vec<f32>> = (0..NRANKS).map(input).collect();

    let loose_ring = all_reduce(&inputs, config("ring", false)?)?;
    let loose_tree = all_reduce(&inputs, config("tree", false)?)?;
    println!(
        "mode off: ring and tree differ in {} of {COUNT} elements",
        differing(&loose_ring[0], &loose_tree[0])
    );

    let ring = all_reduce(&inputs, config("ring", true)?)?;
    let tree = all_reduce(&inputs, config("tree", true)?)?;
    let slices: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    // An all-reduce gives every rank the same result; rank 0's stands for
    // all (each rank is checked below).
    let reference = deterministic::reference(CollKind::AllReduce, &slices, RedOp::Sum, 0)?;

    let mut wrong = 0;
    for rank in 0..NRANKS {
        wrong += differing(&ring[rank], &tree[rank]);
        wrong += differing(&ring[rank], &reference);
    }
    println!(
        "mode on:  ring and tree differ in {} of {COUNT} elements",
        differing(&ring[0], &tree[0])
    );
    let cell = |x: f32| format!("{x:>13.6e} {:08x}", x.to_bits());
    println!(
        "{:>7}  {:>22}  {:>22}  {:>22}",
        "element", "ring (bits)", "tree (bits)", "reference (bits)"
    );
    for i in [0, 1, COUNT / 2, COUNT - 1] {
        println!(
            "{i:>7}  {}  {}  {}",
            cell(ring[0][i]),
            cell(tree[0][i]),
            cell(reference[i])
        );
    }
    if wrong > 0 {
        println!("FAILED: {wrong} elements differ across ranks, selections or the reference");
        return Ok(ExitCode::FAILURE);
    }
    println!("every rank, both selections and the reference agree, bit for bit");
    Ok(ExitCode::SUCCESS)
}
