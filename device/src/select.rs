//! Which backend is active: chosen once per process, by
//! [`select`] (tests pick the emulated GPU this way, without touching the
//! environment) or else from `RCCL_DEVICE` at the first question.
//!
//! `RCCL_DEVICE=emu` picks the emulated GPU, `RCCL_DEVICE=cuda` the CUDA
//! backend; unset picks CUDA when a driver is present, else none (host
//! memory only). This is the one place a backend plugs in.

use std::sync::OnceLock;

use crate::cuda::CudaError;
use crate::cuda_device::CudaDevice;
use crate::{emu, Device, Error, Result};

/// A backend to select.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The emulated GPU (`RCCL_DEVICE=emu`).
    Emu,
    /// CUDA through the driver (`RCCL_DEVICE=cuda`).
    Cuda,
}

/// The outcome of reading `RCCL_DEVICE`: the device, or why there is none.
type Chosen = std::result::Result<&'static dyn Device, String>;

/// The active device, once there is one; it never changes after.
static DEVICE: OnceLock<&'static dyn Device> = OnceLock::new();
/// What `RCCL_DEVICE` asked for, read once.
static FROM_ENV: OnceLock<Chosen> = OnceLock::new();

fn open(kind: Kind) -> Chosen {
    match kind {
        Kind::Emu => Ok(emu::device()),
        Kind::Cuda => open_cuda().map_err(|e| format!("RCCL_DEVICE=cuda: {e}")),
    }
}

/// The CUDA device, opened once (it lives for the process).
fn open_cuda() -> std::result::Result<&'static dyn Device, CudaError> {
    static CUDA: OnceLock<std::result::Result<&'static CudaDevice, CudaError>> = OnceLock::new();
    let device = CUDA.get_or_init(|| CudaDevice::open().map(|d| &*Box::leak(Box::new(d))));
    device.clone().map(|d| d as &'static dyn Device)
}

fn from_env() -> Chosen {
    match rccl_env::var("RCCL_DEVICE").as_deref() {
        Some("emu") => open(Kind::Emu),
        Some("cuda") => open(Kind::Cuda),
        // Unset: CUDA when a driver loads and sees a device, else host
        // memory only.
        None | Some("") => open_cuda().map_err(|e| {
            format!("no device backend: RCCL_DEVICE is unset and no CUDA device was found ({e})")
        }),
        Some(other) => Err(format!(
            "RCCL_DEVICE={other} is not a device backend (emu or cuda)"
        )),
    }
}

/// The active device, if any: the one [`select`]ed, else the one
/// `RCCL_DEVICE` names. Two atomic loads once decided, inline in the
/// caller (every call of the engine asks).
#[inline]
pub fn active() -> Option<&'static dyn Device> {
    match (DEVICE.get(), FROM_ENV.get()) {
        (Some(device), _) => Some(*device),
        // Decided: no device.
        (None, Some(Err(_))) => None,
        (None, _) => active_from_env(),
    }
}

/// [`active`] before a device was selected: the one `RCCL_DEVICE` names.
fn active_from_env() -> Option<&'static dyn Device> {
    let chosen = FROM_ENV.get_or_init(from_env).as_ref().ok()?;
    Some(*DEVICE.get_or_init(|| *chosen))
}

/// Why no device is active, when none is.
pub fn selection_problem() -> Option<&'static str> {
    if DEVICE.get().is_some() {
        return None;
    }
    FROM_ENV
        .get_or_init(from_env)
        .as_ref()
        .err()
        .map(|s| s.as_str())
}

/// Selects `kind` for this process, whatever `RCCL_DEVICE` says (tests
/// pick the emulated GPU this way). Fails when another backend is already
/// active: it holds memory and streams, so it cannot change under them.
pub fn select(kind: Kind) -> Result<&'static dyn Device> {
    let device = open(kind).map_err(Error::InvalidArgument)?;
    let active = *DEVICE.get_or_init(|| device);
    if active.backend() != device.backend() {
        return Err(Error::InvalidArgument(format!(
            "the {} backend is already active in this process",
            active.backend()
        )));
    }
    Ok(active)
}
