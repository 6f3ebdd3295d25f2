//! Communicator settings, from the environment with NCCL's names where NCCL
//! has one, and overridable per communicator.

use std::time::Duration;

use crate::error::{Error, Result};

/// Steps (slots) per connection FIFO, as NCCL's `NCCL_STEPS`.
pub const FIFO_SLOTS: usize = 8;

/// Settings of one communicator.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// How long any wait may last before the operation fails with a report
    /// of what it waited for (`RCCL_TIMEOUT_MS`, default 300 s).
    pub timeout: Duration,
    /// Fewest channels an operation is split across (`NCCL_MIN_NCHANNELS`).
    pub min_channels: usize,
    /// Most channels an operation is split across (`NCCL_MAX_NCHANNELS`).
    pub max_channels: usize,
    /// Bytes of FIFO per connection and direction (`NCCL_BUFFSIZE`,
    /// default 4 MiB), split into [`FIFO_SLOTS`] slots.
    pub buffsize: usize,
    /// Never use shared memory between ranks of one host; go through the
    /// network transport instead (`NCCL_SHM_DISABLE=1`).
    pub shm_disable: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            min_channels: 1,
            max_channels: 2,
            buffsize: 4 << 20,
            shm_disable: false,
        }
    }
}

impl Config {
    /// Defaults overridden by the environment.
    pub fn from_env() -> Result<Config> {
        let mut config = Config::default();
        if let Some(ms) = env_usize("RCCL_TIMEOUT_MS")? {
            config.timeout = Duration::from_millis(ms as u64);
        }
        if let Some(n) = env_usize("NCCL_MIN_NCHANNELS")? {
            config.min_channels = n;
        }
        if let Some(n) = env_usize("NCCL_MAX_NCHANNELS")? {
            config.max_channels = n;
        }
        if let Some(bytes) = env_usize("NCCL_BUFFSIZE")? {
            config.buffsize = bytes;
        }
        if let Some(flag) = env_usize("NCCL_SHM_DISABLE")? {
            config.shm_disable = flag != 0;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings fit together, clamping the channel range.
    pub fn validate(&mut self) -> Result<()> {
        self.max_channels = self.max_channels.clamp(1, MAX_CHANNELS);
        self.min_channels = self.min_channels.clamp(1, self.max_channels);
        if self.buffsize < FIFO_SLOTS * 64 || self.buffsize > (1 << 30) {
            return Err(Error::InvalidArgument(format!(
                "NCCL_BUFFSIZE={} is outside {}..=1GiB",
                self.buffsize,
                FIFO_SLOTS * 64
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the timeout must be positive".into(),
            ));
        }
        Ok(())
    }

    /// Bytes per FIFO slot (a multiple of 64).
    pub fn slot_bytes(&self) -> usize {
        (self.buffsize / FIFO_SLOTS) / 64 * 64
    }
}

/// The most channels a communicator can use.
pub const MAX_CHANNELS: usize = 32;

fn env_usize(name: &str) -> Result<Option<usize>> {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::InvalidArgument(format!("{name}={text:?} is not a number"))),
        Err(_) => Ok(None),
    }
}
