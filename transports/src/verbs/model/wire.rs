//! The model's link: frames on a TCP stream between two NICs.

use std::io::{self, Read, Write};
use std::net::TcpStream;

pub(super) const FRAME_HEADER: usize = 40;
// A frame's kind (the first byte), flag and NAK reason.
pub(super) const HELLO: u8 = 1;
pub(super) const WRITE: u8 = 2;
pub(super) const SEND: u8 = 3;
pub(super) const ACK: u8 = 4;
pub(super) const NAK: u8 = 5;
pub(super) const HAS_IMM: u8 = 1;
pub(super) const NAK_RNR: u8 = 1;
pub(super) const NAK_ACCESS: u8 = 2;
pub(super) const NAK_INVALID: u8 = 3;
/// Most payload bytes of one frame (the provider's largest transfer).
pub(super) const MAX_FRAME_PAYLOAD: u64 = 1 << 30;

/// A stream between two NICs.
pub(super) struct Wire {
    pub(super) stream: TcpStream,
    /// The queue pair that sends on it (outgoing), or that it delivers to
    /// (incoming, once its hello named one).
    pub(super) qpn: Option<u32>,
    pub(super) outgoing: bool,
    pub(super) peer: String,
    pub(super) out: Vec<u8>,
    pub(super) out_at: usize,
    pub(super) inbuf: Vec<u8>,
    pub(super) closed: bool,
}

impl Wire {
    pub(super) fn queue(&mut self, header: &[u8; FRAME_HEADER], payload: &[u8]) {
        self.out.extend_from_slice(header);
        self.out.extend_from_slice(payload);
    }

    pub(super) fn pending_out(&self) -> usize {
        self.out.len() - self.out_at
    }

    /// Writes what the socket takes; `false` if the stream failed.
    pub(super) fn flush(&mut self) -> bool {
        while self.out_at < self.out.len() {
            match self.stream.write(&self.out[self.out_at..]) {
                Ok(0) => return false,
                Ok(n) => self.out_at += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        if self.out_at == self.out.len() {
            self.out.clear();
            self.out_at = 0;
        }
        true
    }

    /// Reads what the socket has (a bounded amount); `false` at its end.
    pub(super) fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 64 * 1024];
        for _ in 0..64 {
            match self.stream.read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => self.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => return false,
            }
        }
        true
    }
}

/// One frame's header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Frame {
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) reason: u8,
    pub(super) psn: u32,
    pub(super) imm: u32,
    pub(super) rkey: u32,
    pub(super) qpn: u32,
    pub(super) src_qpn: u32,
    pub(super) addr: u64,
    pub(super) len: u64,
}

impl Frame {
    pub(super) fn encode(&self) -> [u8; FRAME_HEADER] {
        let mut b = [0u8; FRAME_HEADER];
        b[0] = self.kind;
        b[1] = self.flags;
        b[2] = self.reason;
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..12].copy_from_slice(&self.imm.to_le_bytes());
        b[12..16].copy_from_slice(&self.rkey.to_le_bytes());
        b[16..20].copy_from_slice(&self.qpn.to_le_bytes());
        b[20..24].copy_from_slice(&self.src_qpn.to_le_bytes());
        b[24..32].copy_from_slice(&self.addr.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    pub(super) fn decode(b: &[u8]) -> Frame {
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Frame {
            kind: b[0],
            flags: b[1],
            reason: b[2],
            psn: u32_at(4),
            imm: u32_at(8),
            rkey: u32_at(12),
            qpn: u32_at(16),
            src_qpn: u32_at(20),
            addr: u64_at(24),
            len: u64_at(32),
        }
    }
}
