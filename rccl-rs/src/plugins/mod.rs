//! The engine's C plug-ins beside the network's: tuner and profiler
//! libraries.

pub(crate) mod profiler;
pub(crate) mod tuner;
