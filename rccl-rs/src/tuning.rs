//! The tuner: which algorithm, how many channels and what chunk size each
//! operation gets.

use rccl_algorithms::{Algorithm, CollSpec, Params};

use crate::config::{Config, FIFO_SLOTS};

/// Bytes per channel below which adding a channel does not pay: each
/// channel's connection and pipeline have a fixed cost.
const BYTES_PER_CHANNEL: usize = 512 << 10;

/// What the tuner picked for one operation.
pub struct Choice {
    /// The algorithm whose schedule runs.
    pub algorithm: &'static dyn Algorithm,
    /// Channels and chunking.
    pub params: Params,
}

/// Picks algorithm and parameters for `spec` with `elem_size`-byte
/// elements.
pub fn choose(config: &Config, spec: &CollSpec, elem_size: usize) -> Choice {
    let bytes = spec.count * elem_size;
    let nchannels = channels_for(config, bytes);
    Choice {
        algorithm: rccl_algorithms::default_for(spec.kind),
        params: Params {
            nchannels,
            chunk_elems: (chunk_bytes(config) / elem_size).max(1),
        },
    }
}

/// Channels for a batch of sends and receives whose largest message is
/// `bytes` long.
pub fn p2p_channels(config: &Config, bytes: usize) -> usize {
    channels_for(config, bytes)
}

fn channels_for(config: &Config, bytes: usize) -> usize {
    (bytes / BYTES_PER_CHANNEL).clamp(config.min_channels, config.max_channels)
}

/// The pipeline chunk: half a connection's FIFO, so a sender can fill one
/// chunk while the receiver drains the previous one (and every chunk fits
/// the FIFO, which the schedules' deadlock freedom relies on).
pub fn chunk_bytes(config: &Config) -> usize {
    config.slot_bytes() * FIFO_SLOTS / 2
}
