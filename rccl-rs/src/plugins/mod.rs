//! The engine's C plug-ins beside the network's: tuner and profiler
//! libraries, found and opened by `rccl_env::load` as the environment
//! plug-in is, and driven here through each version of their interface.

pub(crate) mod profiler;
pub(crate) mod tuner;
