//! How a rank learns its place in a job from its launcher (torchrun,
//! Slurm, mpirun) and the environment: its rank and the world size, the
//! rendezvous address, and the secret of a communicator joined there.

mod address;
pub(crate) mod key;
mod rank;

pub(crate) use address::rendezvous_address;
pub use rank::{launcher_rank_from_env, rank_from_env};
