//! What each rank tells the others at init, as bytes: its address, host,
//! process, NICs and the settings every rank must share.

use std::net::SocketAddr;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::net::Nic;

/// What each rank tells the others at init.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PeerInfo {
    /// Its address on the network (the port is not used).
    pub data_addr: SocketAddr,
    /// Its host name, for messages.
    pub host: String,
    /// What identifies its host: ranks with equal ids share memory
    /// (`NCCL_HOSTID`, or the host name and boot id).
    pub host_id: String,
    /// Its process id, for messages.
    pub pid: u32,
    /// Its process's start time (clock ticks since boot, 0 if unknown):
    /// with the pid, what a peer on the same host watches to learn
    /// promptly that it died.
    pub start: u64,
    /// Settings that must agree across ranks: buffsize, min and max
    /// channels, shared memory disabled.
    pub shape: [u64; SHAPE_WORDS],
    /// Its host's network devices, the first one holding `data_addr`'s
    /// address or not (see [`crate::net::select_nics`]).
    pub nics: Vec<Nic>,
}

impl PeerInfo {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let addr = self.data_addr.to_string();
        for field in [
            addr.as_bytes(),
            self.host.as_bytes(),
            self.host_id.as_bytes(),
        ] {
            out.extend_from_slice(&(field.len() as u32).to_le_bytes());
            out.extend_from_slice(field);
        }
        out.extend_from_slice(&self.pid.to_le_bytes());
        out.extend_from_slice(&self.start.to_le_bytes());
        for word in self.shape {
            out.extend_from_slice(&word.to_le_bytes());
        }
        out.extend_from_slice(&(self.nics.len() as u32).to_le_bytes());
        for nic in &self.nics {
            for field in [nic.name.as_bytes(), nic.addr.to_string().as_bytes()] {
                out.extend_from_slice(&(field.len() as u32).to_le_bytes());
                out.extend_from_slice(field);
            }
            out.extend_from_slice(&nic.speed_mbps.to_le_bytes());
        }
        out
    }

    pub(crate) fn decode(bytes: &[u8], rank: usize) -> Result<PeerInfo> {
        let mut reader = Reader(bytes);
        let parsed = (|| {
            let addr = reader.string()?;
            let host = reader.string()?;
            let host_id = reader.string()?;
            let pid = reader.u32()?;
            let start = reader.u64()?;
            let mut shape = [0u64; SHAPE_WORDS];
            for word in &mut shape {
                *word = reader.u64()?;
            }
            let count = reader.u32()? as usize;
            if count > MAX_NICS {
                return None;
            }
            let mut nics = Vec::with_capacity(count);
            for _ in 0..count {
                nics.push(Nic {
                    name: reader.string()?,
                    addr: reader.string()?.parse().ok()?,
                    speed_mbps: reader.u32()?,
                });
            }
            Some(PeerInfo {
                nics,
                data_addr: addr.parse().ok()?,
                host,
                host_id,
                pid,
                start,
                shape,
            })
        })()
        .filter(|_| reader.0.is_empty());
        parsed.ok_or_else(|| Error::Remote(format!("rank {rank} sent malformed init information")))
    }
}

/// A bound on the NICs a peer may announce, before anything is allocated
/// for them (NCCL's socket transport uses at most 16).
const MAX_NICS: usize = 64;

/// Reads little-endian fields off a byte slice.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn string(&mut self) -> Option<String> {
        let len = self.u32()? as usize;
        String::from_utf8(self.take(len)?.to_vec()).ok()
    }
}

/// Words of settings every rank must share.
const SHAPE_WORDS: usize = 8;

/// The settings that must agree across ranks, as words to compare.
pub(super) fn settings_shape(config: &Config) -> [u64; SHAPE_WORDS] {
    use std::hash::{Hash, Hasher};
    let mut selections = std::collections::hash_map::DefaultHasher::new();
    (&config.proto, &config.algo).hash(&mut selections);
    [
        config.buffsize as u64,
        config.ll_buffsize as u64,
        config.ll128_buffsize as u64,
        config.min_channels as u64,
        config.max_channels as u64,
        u64::from(config.shm_disable)
            | u64::from(config.p2p_disable) << 1
            | u64::from(config.deterministic) << 2,
        selections.finish(),
        config.board_bytes as u64,
    ]
}

/// Fuzzing of the init information each rank decodes from every other.
#[cfg(test)]
mod fuzz {
    use super::*;
    use proptest::prelude::*;

    fn info() -> PeerInfo {
        PeerInfo {
            data_addr: "10.0.0.2:4242".parse().unwrap(),
            host: "node".into(),
            host_id: "node/boot".into(),
            pid: 42,
            start: 7,
            shape: [1, 2, 3, 4, 5, 6, 7, 8],
            nics: vec![
                Nic {
                    name: "tb0".into(),
                    addr: "10.231.0.2".parse().unwrap(),
                    speed_mbps: 2000,
                },
                Nic {
                    name: "tb1".into(),
                    addr: "10.232.0.2".parse().unwrap(),
                    speed_mbps: 10_000,
                },
            ],
        }
    }

    #[test]
    fn peer_info_round_trips_and_refuses_trailing_bytes() {
        let bytes = info().encode();
        assert_eq!(PeerInfo::decode(&bytes, 1), Ok(info()));
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(PeerInfo::decode(&longer, 1).is_err());
        assert!(PeerInfo::decode(&bytes[..bytes.len() - 1], 1).is_err());
        // A NIC count past the bound is refused before anything is read.
        let mut many = info();
        many.nics = vec![many.nics[0].clone(); MAX_NICS + 1];
        assert!(PeerInfo::decode(&many.encode(), 1).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn arbitrary_bytes_decode_or_refuse(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Err(err) = PeerInfo::decode(&bytes, 3) {
                prop_assert!(err.to_string().contains("rank 3"));
            }
        }

        #[test]
        fn mutated_info_decodes_or_refuses(at in 0usize..120, value in any::<u8>(), cut in 0usize..130) {
            let mut bytes = info().encode();
            let n = bytes.len();
            bytes[at % n] = value;
            bytes.truncate(cut.max(1));
            let _ = PeerInfo::decode(&bytes, 0);
        }
    }
}
