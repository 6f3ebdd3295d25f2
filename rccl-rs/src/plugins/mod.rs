//! The engine's C plug-ins beside the network's: tuner and profiler
//! libraries, found and opened by `rccl_env::load` as the environment
//! plug-in is, and driven here through each version of their interface.

use std::ffi::{c_int, c_void};

pub(crate) mod profiler;
pub(crate) mod tuner;

/// A plug-in call's result: NCCL's `ncclResult_t`.
type NcclResult = c_int;
/// A plug-in's own state, opaque to the engine.
type PluginContext = *mut c_void;
/// A plug-in's `finalize`: frees its state.
type FinalizeFn = unsafe extern "C" fn(PluginContext) -> NcclResult;
