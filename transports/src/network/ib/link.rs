//! A communicator's verbs resources and their wiring: the queue pairs,
//! the completion queue, the FIFO or size area peers write into, the TCP
//! connection that watches the peer, and the details exchanged to connect.

use super::*;

/// One FIFO entry: where the next send of a slot may land. The sequence
/// number is last, so a sender that sees it sees the whole entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct CtsEntry {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) rkey: u32,
    pub(super) tag: i32,
    pub(super) nreqs: u32,
    pub(super) seq: u32,
}

pub(super) const CTS_BYTES: usize = std::mem::size_of::<CtsEntry>();

impl CtsEntry {
    pub(super) fn to_bytes(self) -> [u8; CTS_BYTES] {
        let mut b = [0u8; CTS_BYTES];
        b[..8].copy_from_slice(&self.addr.to_ne_bytes());
        b[8..16].copy_from_slice(&self.size.to_ne_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_ne_bytes());
        b[20..24].copy_from_slice(&self.tag.to_ne_bytes());
        b[24..28].copy_from_slice(&self.nreqs.to_ne_bytes());
        b[28..32].copy_from_slice(&self.seq.to_ne_bytes());
        b
    }
}

/// Memory the peer writes by RDMA: the sender's FIFO or the receiver's
/// size area (8-byte words, zeroed).
pub(super) struct Area(Box<[u64]>);

impl Area {
    pub(super) fn fifo() -> Area {
        Area(vec![0u64; FIFO_ENTRIES * CTS_BYTES / 8].into_boxed_slice())
    }

    pub(super) fn sizes() -> Area {
        Area(vec![0u64; FIFO_ENTRIES].into_boxed_slice())
    }

    pub(super) fn base(&self) -> *mut u8 {
        self.0.as_ptr() as *mut u8
    }

    pub(super) fn len(&self) -> usize {
        self.0.len() * 8
    }

    /// FIFO entry `i`, once its sequence number is `seq`.
    pub(super) fn entry(&self, i: usize, seq: u32) -> Option<CtsEntry> {
        let at = self.base().wrapping_add(i * CTS_BYTES).cast::<CtsEntry>();
        // SAFETY: entry `i` lies in the area (i < FIFO_ENTRIES); the
        // sequence number is loaded atomically (the NIC writes it last,
        // with release ordering) before the rest is read.
        unsafe {
            let seq_at = std::ptr::addr_of_mut!((*at).seq);
            if AtomicU32::from_ptr(seq_at).load(Ordering::Acquire) != seq {
                return None;
            }
            Some(std::ptr::read_volatile(at))
        }
    }

    /// Size word `i`.
    pub(super) fn size(&self, i: usize) -> u64 {
        // SAFETY: word `i` lies in the area; the NIC wrote it before the
        // completion that made the caller read it.
        unsafe { std::ptr::read_volatile(self.0.as_ptr().add(i)) }
    }
}

/// A communicator's queue pairs, completion queue, and RDMA-written area,
/// with the TCP connection it was set up over.
pub(super) struct Link {
    // Field order is drop order: queue pairs and the region before the
    // area they write.
    pub(super) qps: Vec<Box<dyn QueuePair>>,
    pub(super) cq: Arc<dyn CompletionQueue>,
    pub(super) area_mr: Option<Box<dyn MemoryRegion>>,
    pub(super) area: Area,
    pub(super) device: Arc<dyn Device>,
    pub(super) path: PathSettings,
    pub(super) psns: Vec<u32>,
    pub(super) port_lid: u16,
    pub(super) port_gid: [u8; 16],
    pub(super) port_mtu: u8,
    pub(super) control: Option<TcpStream>,
    pub(super) peer: String,
    /// Why the communicator failed: every pending request fails so.
    pub(super) failed: Option<NetError>,
    pub(super) closed: bool,
    pub(super) last_look: Instant,
    /// The completion queue raises an event for the next completion.
    pub(super) armed: bool,
}

/// The queue-pair details one side sends the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Info {
    pub(super) mtu: u8,
    pub(super) lid: u16,
    pub(super) gid: [u8; 16],
    /// The FIFO (from the sender) or the size area (from the receiver).
    pub(super) addr: u64,
    pub(super) rkey: u32,
    pub(super) qps: Vec<(u32, u32)>,
}

impl Info {
    pub(super) fn of(link: &Link) -> Info {
        Info {
            mtu: link.port_mtu,
            lid: link.port_lid,
            gid: link.port_gid,
            addr: link.area.base() as u64,
            rkey: link.area_mr.as_ref().map_or(0, |mr| mr.rkey()),
            qps: link
                .qps
                .iter()
                .zip(&link.psns)
                .map(|(qp, &psn)| (qp.qpn(), psn))
                .collect(),
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INFO_LEN];
        b[..4].copy_from_slice(&INFO_MAGIC);
        b[4] = 1;
        b[5] = self.qps.len() as u8;
        b[6] = self.mtu;
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[16..32].copy_from_slice(&self.gid);
        b[32..40].copy_from_slice(&self.addr.to_le_bytes());
        b[40..44].copy_from_slice(&self.rkey.to_le_bytes());
        for (i, (qpn, psn)) in self.qps.iter().enumerate() {
            b[48 + 8 * i..52 + 8 * i].copy_from_slice(&qpn.to_le_bytes());
            b[52 + 8 * i..56 + 8 * i].copy_from_slice(&psn.to_le_bytes());
        }
        b
    }

    pub(super) fn decode(b: &[u8]) -> Result<Info, String> {
        if b.len() != INFO_LEN || b[..4] != INFO_MAGIC || b[4] != 1 {
            return Err("malformed queue-pair details".into());
        }
        let nqps = b[5] as usize;
        if !(1..=MAX_QPS).contains(&nqps) {
            return Err(format!("{nqps} queue pairs (1 to {MAX_QPS})"));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        Ok(Info {
            mtu: b[6],
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid: b[16..32].try_into().expect("16 bytes"),
            addr: u64::from_le_bytes(b[32..40].try_into().expect("8 bytes")),
            rkey: u32_at(40),
            qps: (0..nqps)
                .map(|i| (u32_at(48 + 8 * i), u32_at(52 + 8 * i)))
                .collect(),
        })
    }
}

impl Link {
    /// Moves every queue pair to RTR and RTS towards `theirs`.
    pub(super) fn connect(&mut self, theirs: &Info) -> Result<(), VerbsError> {
        for ((qp, &psn), &(qpn, their_psn)) in self.qps.iter().zip(&self.psns).zip(&theirs.qps) {
            let remote = RemoteQp {
                qpn,
                psn: their_psn,
                lid: theirs.lid,
                gid: theirs.gid,
                mtu: theirs.mtu.min(self.port_mtu),
            };
            qp.ready_to_receive(&remote, &self.path)?;
            qp.ready_to_send(psn, &self.path)?;
        }
        Ok(())
    }

    /// Why pending requests cannot complete, if they cannot.
    pub(super) fn broken(&self) -> Option<NetError> {
        if let Some(failed) = &self.failed {
            return Some(failed.clone());
        }
        self.closed.then(|| NetError::Aborted {
            peer: self.peer.clone(),
        })
    }

    /// Fails the communicator; its TCP connection is shut down, so the
    /// peer's side fails too instead of waiting.
    pub(super) fn fail(&mut self, err: NetError) {
        if self.failed.is_none() {
            tracing::info!(target: "NET", "NET/IB: the communicator with {} failed: {err}", self.peer);
            self.failed = Some(err);
            if let Some(control) = &self.control {
                let _ = control.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    pub(super) fn fail_with(&mut self, doing: &'static str, kind: io::ErrorKind, message: String) {
        let peer = self.peer.clone();
        self.fail(NetError::Io {
            net: NET,
            doing,
            peer,
            kind,
            message,
        });
    }

    /// Polls the completion queue into `wcs`; looks for fatal events and,
    /// now and then, for the peer closing the TCP connection. `false` if
    /// the communicator is (now) failed; `wcs` then still holds the
    /// requests that completed before it failed (a peer that saw its last
    /// send complete may close at once), and only those.
    pub(super) fn poll(&mut self, doing: &'static str, wcs: &mut Vec<Wc>) -> bool {
        if self.broken().is_some() {
            return false;
        }
        // Armed before polling, so a completion after this poll raises the
        // event the proxy sleeps on.
        if !self.armed {
            if let Err(e) = self.cq.arm() {
                self.fail_with(doing, io::ErrorKind::Other, e.to_string());
                return false;
            }
            self.armed = true;
        }
        let healthy = self.check(doing, wcs);
        wcs.retain(|wc| wc.status == WcStatus::Success);
        healthy
    }

    /// Drains the completion queue into `wcs` and fails the communicator
    /// if a completion, an event or the peer says so.
    pub(super) fn check(&mut self, doing: &'static str, wcs: &mut Vec<Wc>) -> bool {
        if !self.drain(doing, wcs) {
            return false;
        }
        // A flush only follows the cause: the failed request's status, a
        // fatal event, or the peer closing its side.
        let bad = wcs
            .iter()
            .find(|wc| wc.status != WcStatus::Success && wc.status != WcStatus::Flush)
            .or_else(|| wcs.iter().find(|wc| wc.status == WcStatus::Flush))
            .copied();
        let failed = |wc: &Wc| {
            format!(
                "a work request failed: {} on QP {:#x}",
                wc.status, wc.qp_num
            )
        };
        if let Some(wc) = bad.filter(|wc| wc.status != WcStatus::Flush) {
            self.fail_with(doing, io::ErrorKind::ConnectionAborted, failed(&wc));
            return false;
        }
        // This side's device failing is a cause of its own.
        if let Some(fatal) = self.device.async_error() {
            self.fail_with(doing, io::ErrorKind::ConnectionAborted, fatal);
            return false;
        }
        let fatal = self.qps.iter().find_map(|qp| qp.async_error());
        if bad.is_some() || fatal.is_some() {
            // What completed before the link went is still good.
            self.drain(doing, wcs);
            if let Some(closed) = self.peer_gone() {
                self.fail(closed);
            } else {
                let why = fatal.unwrap_or_else(|| failed(&bad.expect("a flush")));
                self.fail_with(doing, io::ErrorKind::ConnectionAborted, why);
            }
            return false;
        }
        if wcs.is_empty() && self.last_look.elapsed() >= LIVENESS_EVERY {
            self.last_look = Instant::now();
            if let Some(err) = self.peer_gone() {
                self.drain(doing, wcs);
                self.fail(err);
                return false;
            }
        }
        true
    }

    /// Moves every completion the queue holds into `wcs`.
    pub(super) fn drain(&mut self, doing: &'static str, wcs: &mut Vec<Wc>) -> bool {
        let mut batch = [Wc {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: None,
            qp_num: 0,
        }; 64];
        loop {
            match self.cq.poll(&mut batch) {
                Ok(0) => return true,
                Ok(n) => {
                    wcs.extend_from_slice(&batch[..n]);
                    self.armed = false;
                }
                Err(e) => {
                    self.fail_with(doing, io::ErrorKind::Other, e.to_string());
                    return false;
                }
            }
        }
    }

    /// Whether the peer closed the TCP connection (it closed the
    /// communicator, or its process ended).
    pub(super) fn peer_gone(&self) -> Option<NetError> {
        let control = self.control.as_ref()?;
        let mut byte = [0u8; 1];
        // SAFETY: peeks at most one byte into a live buffer from a socket
        // we own, without waiting.
        let n = unsafe {
            libc::recv(
                std::os::fd::AsRawFd::as_raw_fd(control),
                byte.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n == 0 {
            return Some(NetError::Closed {
                peer: self.peer.clone(),
                mid_message: false,
            });
        }
        if n < 0 {
            let err = io::Error::last_os_error();
            if !matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
            ) {
                return Some(NetError::io(NET, "watching", &self.peer, &err));
            }
        }
        None
    }

    pub(super) fn post_send(&mut self, qp: usize, wrs: &[SendWr], doing: &'static str) -> bool {
        if wrs.is_empty() {
            return true;
        }
        match self.qps[qp].post_send(wrs) {
            Ok(()) => true,
            Err(e) => {
                self.fail_with(doing, io::ErrorKind::Other, e.to_string());
                false
            }
        }
    }
}

/// Closes a communicator: its queue pairs go (the peer's fail), and so
/// does the TCP connection (the peer sees it close).
pub(super) fn close(link: &mut Link) {
    link.closed = true;
    // The TCP connection first: the peer learns that this side closed
    // before its queue pairs see theirs go.
    link.control = None;
    link.qps.clear();
}
