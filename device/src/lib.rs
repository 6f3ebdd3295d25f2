//! GPU memory, streams, events and kernels behind one interface.
//!
//! Nothing outside this crate knows CUDA exists. Two backends: `cuda`,
//! reached through cudarc with the driver loaded at run time (a machine
//! without a driver gets an error, never a panic), and `emu`, an emulated
//! GPU that CI runs (`RCCL_DEVICE=emu`).
//!
//! The kernels (`kernels/`, CUDA C++) are prebuilt into `fatbin/` by
//! `scripts/build-kernels.sh`; their host twin, the same sources compiled
//! by the host's C++ compiler, is [`twin`].

pub mod abi;
pub mod cuda;
pub mod twin;
pub mod work;

/// The kernels' fatbin (SASS for sm_80, sm_90, sm_100 and compute_80
/// PTX), built from `kernels/` by `scripts/build-kernels.sh`.
pub static KERNELS_FATBIN: &[u8] = include_bytes!("../fatbin/kernels.fatbin");

/// What the fatbin was built from (`fatbin/MANIFEST`).
pub static KERNELS_MANIFEST: &str = include_str!("../fatbin/MANIFEST");
