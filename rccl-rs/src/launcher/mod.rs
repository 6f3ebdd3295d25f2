//! How a rank learns its place in a job from its launcher (torchrun,
//! Slurm, mpirun) and the environment.

pub(crate) mod key;
