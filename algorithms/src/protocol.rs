//! The three protocols a connection's slots may use, and the FIFO memory
//! each needs: one vocabulary for the transports that move bytes, the
//! device kernels that move them on a GPU, the tuner that picks one and the
//! simulator that models them.

use serde::{Deserialize, Serialize};

/// How a slot carries its bytes and their readiness. The discriminants are
/// the values the device kernels take (`kernels/fifo.h`); [`Protocol::abi`]
/// gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[repr(u32)]
pub enum Protocol {
    /// Low latency: 8-byte words of 4 data bytes and a 4-byte flag.
    #[serde(rename = "LL")]
    Ll = 0,
    /// Low latency, 128-byte lines of 120 data bytes and an 8-byte flag.
    #[serde(rename = "LL128")]
    Ll128 = 1,
    /// Whole pieces published by a tail counter.
    Simple = 2,
}

impl Protocol {
    /// Every protocol, in NCCL's order.
    pub const ALL: [Protocol; 3] = [Protocol::Ll, Protocol::Ll128, Protocol::Simple];

    /// NCCL's name (`LL`, `LL128`, `Simple`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Ll => "LL",
            Protocol::Ll128 => "LL128",
            Protocol::Simple => "Simple",
        }
    }

    /// The protocol called `name` (case-insensitive).
    pub fn parse(name: &str) -> Option<Protocol> {
        Protocol::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// Position in [`Protocol::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The value the device kernels know this protocol by.
    pub const fn abi(self) -> u32 {
        self as u32
    }

    /// Bytes of FIFO memory one slot of `slot_bytes` payload takes.
    pub fn slot_stride(self, slot_bytes: usize) -> usize {
        let raw = match self {
            Protocol::Simple => SLOT_HEADER + slot_bytes,
            Protocol::Ll => (LL_HEADER_WORDS + slot_bytes.div_ceil(LL_DATA)) * LL_WORD,
            Protocol::Ll128 => (1 + slot_bytes.div_ceil(LL128_DATA)) * LL128_LINE,
        };
        raw.next_multiple_of(SLOT_ALIGN)
    }
}

/// Bytes of a FIFO's control block (its counters, state and sleepers),
/// in front of its slots when laid out whole.
pub const FIFO_CONTROL_BYTES: usize = 4096;
/// Alignment of a FIFO's memory and size.
pub const FIFO_ALIGN: usize = 4096;
/// Alignment of each slot.
pub const SLOT_ALIGN: usize = 64;
/// Bytes in front of a Simple slot's payload: its length and tag, then
/// padding to a cache line. A proxy that moves slots whole moves these
/// too, so the piece's length and tag travel with it.
pub const SLOT_HEADER: usize = 64;
/// Bytes of an LL word.
pub const LL_WORD: usize = 8;
/// Data bytes of an LL word (the rest is its flag).
pub const LL_DATA: usize = 4;
/// LL words in front of a slot's payload: length, seq, call, count.
pub const LL_HEADER_WORDS: usize = 4;
/// Bytes of an LL128 line.
pub const LL128_LINE: usize = 128;
/// Data bytes of an LL128 line (the rest is its flag).
pub const LL128_DATA: usize = 120;

/// Bytes a FIFO of `nslots` slots of `slot_bytes` payload each needs: the
/// control block, then the slots, rounded up to [`FIFO_ALIGN`].
pub fn fifo_bytes(proto: Protocol, nslots: usize, slot_bytes: usize) -> usize {
    (FIFO_CONTROL_BYTES + nslots * proto.slot_stride(slot_bytes)).next_multiple_of(FIFO_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernels (`kernels/fifo.h`) know the protocols by these numbers.
    #[test]
    fn abi_values_are_the_kernels() {
        assert_eq!(Protocol::Ll.abi(), 0);
        assert_eq!(Protocol::Ll128.abi(), 1);
        assert_eq!(Protocol::Simple.abi(), 2);
        for (i, p) in Protocol::ALL.into_iter().enumerate() {
            assert_eq!(p.index(), i);
        }
    }

    #[test]
    fn names_round_trip() {
        for p in Protocol::ALL {
            assert_eq!(Protocol::parse(p.name()), Some(p));
            assert_eq!(Protocol::parse(&p.name().to_lowercase()), Some(p));
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.name()));
            assert_eq!(serde_json::from_str::<Protocol>(&json).unwrap(), p);
        }
        assert_eq!(Protocol::parse("ll256"), None);
    }

    /// Sizes worked by hand from the layouts above.
    #[test]
    fn fifo_sizes() {
        // Simple: 64 + 1000 -> 1088 per slot; 4096 + 2 * 1088 -> 8192.
        assert_eq!(fifo_bytes(Protocol::Simple, 2, 1000), 8192);
        // LL: (4 + 250) * 8 = 2032 -> 2048 per slot; 4096 + 8 * 2048 = 20480.
        assert_eq!(fifo_bytes(Protocol::Ll, 8, 1000), 20480);
        // LL128: (1 + 9) * 128 = 1280 per slot; 4096 + 4 * 1280 -> 12288.
        assert_eq!(fifo_bytes(Protocol::Ll128, 4, 1000), 12288);
        assert_eq!(fifo_bytes(Protocol::Simple, 0, 1000), FIFO_CONTROL_BYTES);
    }
}
