//! Data-parallel training in miniature: four ranks, each with its own
//! shard of data, average their gradients with an all-reduce every step and
//! so keep identical weights.
//!
//! ```sh
//! cargo run --release --example data_parallel
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

use rccl::{Communicator, RedOp};

/// Fits y = w * x by gradient descent on this rank's shard.
fn gradient(w: f32, shard: &[(f32, f32)]) -> f32 {
    shard
        .iter()
        .map(|&(x, y)| 2.0 * (w * x - y) * x)
        .sum::<f32>()
        / shard.len() as f32
}

fn main() -> Result<(), rccl::Error> {
    let nranks = 4;
    let comms = Communicator::init_all(nranks)?;
    let weights: Vec<f32> = std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || -> Result<f32, rccl::Error> {
                    // Each rank sees different points of the line y = 3x.
                    let shard: Vec<(f32, f32)> = (0..64)
                        .map(|i| {
                            let x = (comm.rank() * 64 + i) as f32 / 256.0;
                            (x, 3.0 * x)
                        })
                        .collect();
                    let mut w = 0.0f32;
                    for _ in 0..200 {
                        let mut g = [gradient(w, &shard)];
                        comm.all_reduce_in_place(&mut g, RedOp::Avg)?;
                        w -= 0.5 * g[0];
                    }
                    Ok(w)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Result<_, _>>()
    })?;
    for (rank, w) in weights.iter().enumerate() {
        println!("rank {rank}: w = {w:.4}");
    }
    assert!(weights.windows(2).all(|p| p[0].to_bits() == p[1].to_bits()));
    println!("every rank holds the same weights, bit for bit");
    Ok(())
}
