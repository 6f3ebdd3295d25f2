//! Communicator settings, from the environment with NCCL's names where NCCL
//! has one, and overridable per communicator.

use std::time::Duration;

use rccl_transports::{FifoShape, Protocol};

use crate::error::{Error, Result};
use crate::kernels::Store;
use crate::selection::Selection;

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
    /// default 4 MiB), split into 8 slots (NCCL_STEPS).
    pub buffsize: usize,
    /// Bytes of LL FIFO payload per connection and direction
    /// (`NCCL_LL_BUFFSIZE`, default 64 KiB).
    pub ll_buffsize: usize,
    /// Bytes of LL128 FIFO payload per connection and direction
    /// (`NCCL_LL128_BUFFSIZE`, default 480 KiB).
    pub ll128_buffsize: usize,
    /// Never use shared memory between ranks of one host; go through the
    /// network transport instead (`NCCL_SHM_DISABLE=1`).
    pub shm_disable: bool,
    /// The network to use, by name, ignoring case (`NCCL_NET`: `Socket`,
    /// or a net plug-in's name); `None`: the first that opens (see
    /// `rccl_transports::network::choose`).
    pub net: Option<String>,
    /// Never connect ranks of different processes through device memory
    /// one exports and the other maps (`NCCL_P2P_DISABLE=1`): calls on
    /// device memory then go through shared memory.
    pub p2p_disable: bool,
    /// Whether device work across hosts may keep its FIFOs' slots in
    /// device memory where the network registers it (GPUDirect RDMA):
    /// `NCCL_NET_GDR_LEVEL` other than `LOC` (or 0). Without, the slots are
    /// page-locked host memory the device writes and reads across the bus.
    pub net_gdr: bool,
    /// Whether GPUDirect RDMA may register device memory as a dma-buf
    /// where the network takes those (`NCCL_DMABUF_ENABLE`, default 1;
    /// 0: through `nvidia-peermem` only).
    pub dmabuf: bool,
    /// Which protocols the tuner may use (`NCCL_PROTO`, NCCL's syntax:
    /// `LL,LL128`, `^LL`, per collective `allreduce:LL;broadcast:^LL128`).
    pub proto: Selection,
    /// Which algorithms the tuner may use (`NCCL_ALGO`, same syntax).
    pub algo: Selection,
    /// Bytes each rank may post on the board, the shared segment through
    /// which one-shot all-reduce runs when every rank shares a host
    /// (`RCCL_BOARD_BYTES`, default 64 KiB; 0 turns the board off).
    pub board_bytes: usize,
    /// Calls whose buffers on a rank (send plus receive) hold at least this
    /// many bytes write the user's buffers with non-temporal stores, which
    /// skip the read of each line a cached store would make
    /// (`RCCL_NT_STORE_BYTES`, default the last-level cache's size; 0 never
    /// streams).
    pub nt_store_bytes: usize,
    /// Whether AllReduce, ReduceScatter and Reduce give the same bits
    /// whatever the algorithm, protocol, channels, chunk and placement
    /// (`NCCL_DETERMINISTIC=1`): they run the ordered ring, whose order per
    /// element `rccl::deterministic::reduction_order` states.
    pub deterministic: bool,
    /// The most bytes the communicator may hold (FIFOs, board, staging,
    /// windows: `rccl::Ledger`); an allocation past it fails naming what
    /// asked (`NCCL_MAX_MEM_BYTES`; `None`, the default: no limit).
    pub max_mem_bytes: Option<u64>,
    /// One-sided contexts: the `ctx` of ncclPutSignal, ncclSignal and
    /// ncclWaitSignal lies in `0..rma_contexts` (`NCCL_NUM_RMA_CTX`,
    /// `ncclConfig_t.numRmaCtx`, default 1).
    pub rma_contexts: usize,
    /// Signal indices per one-sided context: `sigIdx` lies in
    /// `0..rma_signals` (`NCCL_NUM_RMA_SIG`, `ncclConfig_t.numRmaSig`,
    /// default 1).
    pub rma_signals: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            timeout: Duration::from_secs(300),
            min_channels: 1,
            max_channels: 2,
            buffsize: 4 << 20,
            ll_buffsize: 64 << 10,
            ll128_buffsize: 480 << 10,
            shm_disable: false,
            net: None,
            p2p_disable: false,
            net_gdr: true,
            dmabuf: true,
            proto: Selection::default(),
            algo: Selection::default(),
            board_bytes: 64 << 10,
            nt_store_bytes: last_level_cache_bytes(),
            deterministic: false,
            max_mem_bytes: None,
            rma_contexts: 1,
            rma_signals: 1,
        }
    }
}

/// The largest data cache of CPU 0 as `/sys` describes it, or 32 MiB
/// where it cannot be read: beyond it a call's buffers stream through
/// memory.
pub fn last_level_cache_bytes() -> usize {
    const UNKNOWN: usize = 32 << 20;
    let Ok(entries) = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache") else {
        return UNKNOWN;
    };
    entries
        .flatten()
        .filter(|entry| {
            let kind = std::fs::read_to_string(entry.path().join("type")).unwrap_or_default();
            matches!(kind.trim(), "Data" | "Unified")
        })
        .filter_map(|entry| std::fs::read_to_string(entry.path().join("size")).ok())
        .filter_map(|text| parse_cache_size(text.trim()))
        .max()
        .unwrap_or(UNKNOWN)
}

/// A `/sys` cache size: `32768K`, `1M` or plain bytes.
fn parse_cache_size(text: &str) -> Option<usize> {
    let (digits, unit) = match text.as_bytes().last()? {
        b'K' => (&text[..text.len() - 1], 1 << 10),
        b'M' => (&text[..text.len() - 1], 1 << 20),
        b'G' => (&text[..text.len() - 1], 1 << 30),
        _ => (text, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(unit)
}

impl Config {
    /// How calls whose buffers on this rank hold `bytes` bytes write the
    /// user's buffers.
    pub fn user_store(&self, bytes: usize) -> Store {
        if self.nt_store_bytes > 0 && bytes >= self.nt_store_bytes {
            Store::Streaming
        } else {
            Store::Cached
        }
    }

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
        if let Some(bytes) = env_usize("NCCL_LL_BUFFSIZE")? {
            config.ll_buffsize = bytes;
        }
        if let Some(bytes) = env_usize("NCCL_LL128_BUFFSIZE")? {
            config.ll128_buffsize = bytes;
        }
        if let Some(text) = rccl_env::var("NCCL_PROTO") {
            config.proto = Selection::parse("NCCL_PROTO", &text)?;
        }
        if let Some(text) = rccl_env::var("NCCL_ALGO") {
            config.algo = Selection::parse("NCCL_ALGO", &text)?;
        }
        if let Some(bytes) = env_usize("RCCL_BOARD_BYTES")? {
            config.board_bytes = bytes;
        }
        if let Some(bytes) = env_usize("RCCL_NT_STORE_BYTES")? {
            config.nt_store_bytes = bytes;
        }
        if let Some(flag) = env_usize("NCCL_SHM_DISABLE")? {
            config.shm_disable = flag != 0;
        }
        if let Some(name) = rccl_env::var("NCCL_NET") {
            config.net = Some(name).filter(|name| !name.is_empty());
        }
        if let Some(flag) = env_usize("NCCL_P2P_DISABLE")? {
            config.p2p_disable = flag != 0;
        }
        if let Some(flag) = env_usize("NCCL_DMABUF_ENABLE")? {
            config.dmabuf = flag != 0;
        }
        if let Some(flag) = env_usize("NCCL_DETERMINISTIC")? {
            config.deterministic = flag != 0;
        }
        if let Some(bytes) = env_usize("NCCL_MAX_MEM_BYTES")? {
            config.max_mem_bytes = Some(bytes as u64);
        }
        if let Some(n) = env_usize("NCCL_NUM_RMA_CTX")? {
            config.rma_contexts = n;
        }
        if let Some(n) = env_usize("NCCL_NUM_RMA_SIG")? {
            config.rma_signals = n;
        }
        if let Some(level) = rccl_env::var("NCCL_NET_GDR_LEVEL") {
            config.net_gdr = gdr_level(&level)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Checks the settings fit together, clamping the channel range.
    pub fn validate(&mut self) -> Result<()> {
        self.max_channels = self.max_channels.clamp(1, MAX_CHANNELS);
        self.min_channels = self.min_channels.clamp(1, self.max_channels);
        for (name, bytes) in [
            ("NCCL_BUFFSIZE", self.buffsize),
            ("NCCL_LL_BUFFSIZE", self.ll_buffsize),
            ("NCCL_LL128_BUFFSIZE", self.ll128_buffsize),
        ] {
            if !(FIFO_SLOTS * 128..=(1 << 30)).contains(&bytes) {
                return Err(Error::InvalidArgument(format!(
                    "{name}={bytes} is outside {}..=1GiB",
                    FIFO_SLOTS * 128
                )));
            }
        }
        if self.fifo_shape().slot_bytes.contains(&0) {
            return Err(Error::InvalidArgument(format!(
                "FIFO sizes leave a protocol without room for one slot: {:?}",
                self.fifo_shape()
            )));
        }
        self.proto.check_names(
            "NCCL_PROTO",
            "protocol",
            &Protocol::ALL.map(Protocol::name),
            &[],
        )?;
        if self.board_bytes > MAX_BOARD_BYTES {
            return Err(Error::InvalidArgument(format!(
                "RCCL_BOARD_BYTES={} is above {MAX_BOARD_BYTES}",
                self.board_bytes
            )));
        }
        if self.timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the timeout must be positive".into(),
            ));
        }
        Ok(())
    }

    /// The slots of every connection: per protocol, the payload per slot
    /// (a multiple of 8; for LL128 also of its 120-byte lines).
    pub fn fifo_shape(&self) -> FifoShape {
        let per_slot = |bytes: usize, unit: usize| (bytes / FIFO_SLOTS) / unit * unit;
        FifoShape {
            nslots: FIFO_SLOTS,
            slot_bytes: [
                per_slot(self.ll_buffsize, 64),
                per_slot(self.ll128_buffsize, 960),
                per_slot(self.buffsize, 64),
            ],
        }
    }

    /// Payload bytes per slot of `proto`.
    pub fn slot_bytes(&self, proto: Protocol) -> usize {
        self.fifo_shape().slot_bytes(proto)
    }
}

/// The most channels a communicator can use.
pub const MAX_CHANNELS: usize = 32;

/// Most bytes one rank may post on the board (it holds two posts per rank).
pub const MAX_BOARD_BYTES: usize = 16 << 20;

/// The number in environment variable `name`, if it is set.
pub(crate) fn env_usize(name: &str) -> Result<Option<usize>> {
    match rccl_env::var(name) {
        Some(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| Error::InvalidArgument(format!("{name}={text:?} is not a number"))),
        None => Ok(None),
    }
}

/// `NCCL_NET_GDR_LEVEL`: the farthest a NIC may be from the GPU for
/// GPUDirect RDMA, by name (`LOC`, `PIX`, `PXB`, `PHB`, `SYS`) or number;
/// the placement of NICs and GPUs is not modeled, so only `LOC` (0), "never",
/// differs from the others.
fn gdr_level(level: &str) -> Result<bool> {
    const LEVELS: [&str; 5] = ["LOC", "PIX", "PXB", "PHB", "SYS"];
    let level = level.trim();
    let index = match LEVELS.iter().position(|l| l.eq_ignore_ascii_case(level)) {
        Some(index) => index,
        None => level.parse::<usize>().map_err(|_| {
            Error::InvalidArgument(format!(
                "NCCL_NET_GDR_LEVEL={level:?} is none of {} nor a number",
                LEVELS.join(", ")
            ))
        })?,
    };
    Ok(index > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdr_level_loc_alone_turns_gpu_direct_off() {
        assert!(!gdr_level("LOC").unwrap());
        assert!(!gdr_level("0").unwrap());
        assert!(gdr_level("sys").unwrap());
        assert!(gdr_level("PHB").unwrap());
        assert!(gdr_level("3").unwrap());
        let err = gdr_level("near").unwrap_err().to_string();
        assert!(
            err.contains("NCCL_NET_GDR_LEVEL") && err.contains("PXB"),
            "{err}"
        );
    }

    #[test]
    fn cache_sizes_parse_as_sys_writes_them() {
        assert_eq!(parse_cache_size("32768K"), Some(32 << 20));
        assert_eq!(parse_cache_size("1M"), Some(1 << 20));
        assert_eq!(parse_cache_size("4096"), Some(4096));
        assert_eq!(parse_cache_size("K"), None);
        assert_eq!(parse_cache_size(""), None);
        assert!(last_level_cache_bytes() > 0);
    }

    #[test]
    fn calls_at_the_threshold_stream_and_zero_never_does() {
        let config = Config {
            nt_store_bytes: 1 << 20,
            ..Config::default()
        };
        assert_eq!(config.user_store((1 << 20) - 1), Store::Cached);
        assert_eq!(config.user_store(1 << 20), Store::Streaming);
        let never = Config {
            nt_store_bytes: 0,
            ..Config::default()
        };
        assert_eq!(never.user_store(usize::MAX), Store::Cached);
    }
}
