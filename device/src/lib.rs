//! GPU memory, streams, events and kernels behind one interface.
//!
//! Nothing outside this crate knows CUDA exists. Two backends: `cuda`,
//! reached through cudarc with the driver loaded at run time (a machine
//! without a driver gets an error, never a panic), and `emu`, an emulated
//! GPU that CI runs (`RCCL_DEVICE=emu`).
//!
//! The kernels (`kernels/`, CUDA C++) have a host twin, the same sources
//! compiled by the host's C++ compiler: [`twin`].

pub mod abi;
pub mod twin;
