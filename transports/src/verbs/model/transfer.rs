//! What the NIC does on its wires: answers and acknowledgements, the
//! responder's writes and receives, the requester's transmissions,
//! retransmissions and timeouts, and injected faults.

use super::*;

impl NicState {
    pub(super) fn add_wire(&mut self, wire: Wire) -> usize {
        if let Some(free) = self.wires.iter().position(Option::is_none) {
            self.wires[free] = Some(wire);
            free
        } else {
            self.wires.push(Some(wire));
            self.wires.len() - 1
        }
    }

    pub(super) fn wire_mut(&mut self, i: usize) -> &mut Wire {
        self.wires[i].as_mut().expect("a live wire")
    }

    /// When a timer next needs the NIC.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let mut next = self.stall_until;
        let mut consider = |at: Instant| next = Some(next.map_or(at, |n: Instant| n.min(at)));
        for qp in self.qps.values() {
            if let Some(at) = qp.resend_at {
                consider(at);
            }
            if let (Some(out), Some(path)) = (qp.unacked.front(), &qp.path) {
                if let (Some(sent), Some(timeout)) = (out.sent_at, ack_timeout(path.timeout)) {
                    consider(sent + timeout);
                }
            }
        }
        next
    }

    /// The stream of queue pair `qpn` ended: a fatal event on it.
    pub(super) fn link_lost(&mut self, wire: &Wire) {
        let Some(qpn) = wire.qpn else { return };
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if qp.fatal.is_none() {
            qp.fatal = Some(format!(
                "the link to {} went down (IBV_EVENT_QP_FATAL on QP {qpn:#x})",
                wire.peer
            ));
        }
        // With this NIC's own port down, its requests time out as on a
        // fabric; the far end sees its link go at once.
        if qp.state != QpState::Error && self.port_error.is_none() {
            qp.enter_error(qpn);
        }
        if qp
            .wire
            .is_some_and(|w| self.wires.get(w).is_none_or(Option::is_none))
        {
            qp.wire = None;
        }
    }

    /// Answers `frame` on wire `i` with an ACK or NAK.
    pub(super) fn answer(&mut self, i: usize, kind: u8, psn: u32, reason: u8) {
        let header = Frame {
            kind,
            psn,
            reason,
            ..Frame::default()
        }
        .encode();
        self.wire_mut(i).queue(&header, &[]);
    }

    pub(super) fn handle(&mut self, i: usize, frame: &Frame, payload: &[u8]) {
        let wire = self.wire_mut(i);
        match frame.kind {
            HELLO if !wire.outgoing => wire.qpn = Some(frame.qpn),
            ACK | NAK if wire.outgoing => {
                let Some(qpn) = wire.qpn else { return };
                self.requester_answer(qpn, frame);
            }
            WRITE | SEND if !wire.outgoing => {
                let Some(qpn) = wire.qpn else { return };
                self.respond(i, qpn, frame, payload);
            }
            _ => wire.closed = true,
        }
    }

    /// The responder side: a WRITE or SEND for queue pair `qpn`.
    pub(super) fn respond(&mut self, i: usize, qpn: u32, frame: &Frame, payload: &[u8]) {
        let regions = &self.regions;
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if !matches!(qp.state, QpState::Rtr | QpState::Rts) {
            return;
        }
        if psn_distance(qp.expect_psn, frame.psn) > 0 {
            // A duplicate of something already received.
            let ack = qp.expect_psn.wrapping_sub(1) & PSN_MASK;
            self.answer(i, ACK, ack, 0);
            return;
        }
        if frame.psn != qp.expect_psn {
            return;
        }
        let with_imm = frame.flags & HAS_IMM != 0;
        let (status, nak) = if frame.kind == WRITE {
            let target = regions
                .get(&frame.rkey)
                .filter(|r| frame.len == 0 || r.covers(frame.addr, frame.len, ACCESS_REMOTE_WRITE));
            if target.is_none() && frame.len > 0 {
                (Some(WcStatus::RemoteAccess), NAK_ACCESS)
            } else if with_imm && qp.recvs.is_empty() {
                (None, NAK_RNR)
            } else {
                if let Some(region) = target.filter(|_| frame.len > 0) {
                    // SAFETY: the range lies in a region registered for
                    // remote writes, which its owner keeps valid while
                    // registered (reg_mr's contract).
                    unsafe { write_ordered(region.reach(frame.addr) as *mut u8, payload) };
                }
                if with_imm {
                    let recv = qp.recvs.pop_front().expect("checked");
                    self.arrived = Some((
                        qp.cq.clone(),
                        Wc {
                            wr_id: recv.wr_id,
                            status: WcStatus::Success,
                            opcode: WcOpcode::RecvRdmaWithImm,
                            byte_len: frame.len as u32,
                            imm: Some(frame.imm),
                            qp_num: qpn,
                        },
                    ));
                }
                (Some(WcStatus::Success), 0)
            }
        } else {
            match qp.recvs.front().copied() {
                None => (None, NAK_RNR),
                Some(recv) => {
                    let room = recv.sge.and_then(|sge| {
                        let region = regions.get(&sge.lkey).filter(|r| {
                            r.covers(sge.addr, u64::from(sge.len), ACCESS_LOCAL_WRITE)
                        })?;
                        Some((sge, region))
                    });
                    let fits = room.is_some_and(|(sge, _)| frame.len <= u64::from(sge.len))
                        || frame.len == 0;
                    qp.recvs.pop_front();
                    if fits {
                        if let Some((sge, region)) = room {
                            // SAFETY: the receive's buffer lies in a region
                            // registered for local writes (checked above).
                            unsafe { write_ordered(region.reach(sge.addr) as *mut u8, payload) };
                        }
                    }
                    self.arrived = Some((
                        qp.cq.clone(),
                        Wc {
                            wr_id: recv.wr_id,
                            status: if fits {
                                WcStatus::Success
                            } else {
                                WcStatus::LocalLength
                            },
                            opcode: WcOpcode::Recv,
                            byte_len: frame.len as u32,
                            imm: (frame.flags & HAS_IMM != 0).then_some(frame.imm),
                            qp_num: qpn,
                        },
                    ));
                    if fits {
                        (Some(WcStatus::Success), 0)
                    } else {
                        (Some(WcStatus::LocalLength), NAK_INVALID)
                    }
                }
            }
        };
        match status {
            Some(WcStatus::Success) => {
                qp.expect_psn = psn_after(qp.expect_psn);
                self.answer(i, ACK, frame.psn, 0);
                let wire = self.wire_mut(i);
                if !wire.flush() {
                    wire.closed = true;
                }
                self.deliver_arrived();
            }
            None => self.answer(i, NAK, frame.psn, nak),
            Some(_) => {
                // The failed receive's completion comes before the flushed
                // ones.
                self.deliver_arrived();
                let qp = self.qps.get_mut(&qpn).expect("seen above");
                if qp.fatal.is_none() && nak == NAK_ACCESS {
                    qp.fatal = Some(format!(
                        "a remote access violation on QP {qpn:#x} (IBV_EVENT_QP_ACCESS_ERR)"
                    ));
                }
                qp.enter_error(qpn);
                self.answer(i, NAK, frame.psn, nak);
            }
        }
    }

    pub(super) fn deliver_arrived(&mut self) {
        if let Some((cq, wc)) = self.arrived.take() {
            complete(&cq, wc);
        }
    }

    /// The requester side: an ACK or NAK for queue pair `qpn`.
    pub(super) fn requester_answer(&mut self, qpn: u32, frame: &Frame) {
        let Some(qp) = self.qps.get_mut(&qpn) else {
            return;
        };
        if qp.state == QpState::Error {
            return;
        }
        if frame.kind == ACK {
            qp.acknowledge(qpn, frame.psn);
            return;
        }
        qp.acknowledge(qpn, frame.psn.wrapping_sub(1) & PSN_MASK);
        if qp.unacked.front().is_none_or(|out| out.psn != frame.psn) {
            return;
        }
        match frame.reason {
            NAK_RNR => {
                let infinite = qp.path.is_some_and(|p| p.rnr_retry == 7);
                if !infinite && qp.rnr_left == 0 {
                    qp.fail(qpn, WcStatus::RnrRetryExceeded);
                    return;
                }
                if !infinite {
                    qp.rnr_left -= 1;
                }
                qp.go_back();
                qp.resend_at = Some(Instant::now() + RNR_DELAY);
            }
            NAK_ACCESS => qp.fail(qpn, WcStatus::RemoteAccess),
            _ => qp.fail(qpn, WcStatus::Other(9)),
        }
    }

    pub(super) fn run_timers(&mut self, now: Instant) {
        for (&qpn, qp) in self.qps.iter_mut() {
            if qp.state != QpState::Rts {
                continue;
            }
            if qp.resend_at.is_some_and(|at| now >= at) {
                qp.resend_at = None;
            }
            let (Some(out), Some(path)) = (qp.unacked.front(), qp.path) else {
                continue;
            };
            let (Some(sent), Some(timeout)) = (out.sent_at, ack_timeout(path.timeout)) else {
                continue;
            };
            if now < sent + timeout {
                continue;
            }
            if qp.retries_left == 0 {
                qp.fail(qpn, WcStatus::RetryExceeded);
            } else {
                qp.retries_left -= 1;
                qp.go_back();
            }
        }
    }

    /// Moves queued work requests onto their streams.
    pub(super) fn transmit(&mut self, now: Instant) {
        let qpns: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, qp)| {
                qp.state == QpState::Rts && !qp.queued.is_empty() && qp.resend_at.is_none()
            })
            .map(|(&qpn, _)| qpn)
            .collect();
        for qpn in qpns {
            loop {
                let qp = self.qps.get_mut(&qpn).expect("listed");
                let wire = qp.wire;
                if wire.is_some_and(|w| {
                    self.wires[w]
                        .as_ref()
                        .is_some_and(|w| w.pending_out() >= WIRE_QUEUE)
                }) {
                    break;
                }
                let qp = self.qps.get_mut(&qpn).expect("listed");
                let Some(mut out) = qp.queued.pop_front() else {
                    break;
                };
                let first = !out.sent_once;
                out.sent_once = true;
                if out.payload.is_none() {
                    match out.wr.sge {
                        None => out.payload = Some(Vec::new()),
                        Some(sge) => {
                            let local = self
                                .regions
                                .get(&sge.lkey)
                                .filter(|r| r.covers(sge.addr, u64::from(sge.len), 0))
                                .copied();
                            let Some(local) = local else {
                                let qp = self.qps.get_mut(&qpn).expect("listed");
                                qp.complete(Wc {
                                    wr_id: out.wr.wr_id,
                                    status: WcStatus::LocalProtection,
                                    opcode: send_opcode(&out.wr),
                                    byte_len: 0,
                                    imm: None,
                                    qp_num: qpn,
                                });
                                qp.enter_error(qpn);
                                break;
                            };
                            // SAFETY: the bytes lie in a registered region
                            // (checked above) that its owner keeps valid
                            // and unwritten while the send is outstanding.
                            let bytes = unsafe {
                                std::slice::from_raw_parts(
                                    local.reach(sge.addr) as *const u8,
                                    sge.len as usize,
                                )
                            };
                            out.payload = Some(bytes.to_vec());
                        }
                    }
                }
                let mut frame = Frame {
                    psn: out.psn,
                    len: out.payload.as_ref().map_or(0, |p| p.len() as u64),
                    ..Frame::default()
                };
                match out.wr.op {
                    SendOp::Write {
                        remote_addr,
                        rkey,
                        imm,
                    } => {
                        frame.kind = WRITE;
                        frame.addr = remote_addr;
                        frame.rkey = rkey;
                        if let Some(imm) = imm {
                            frame.flags = HAS_IMM;
                            frame.imm = imm;
                        }
                    }
                    SendOp::Send => frame.kind = SEND,
                }
                if first {
                    self.frames_sent += 1;
                    self.trigger_faults();
                    if self.corrupt_next && frame.kind == WRITE && frame.len > 0 {
                        self.corrupt_next = false;
                        frame.rkey ^= 0x5a5a_5a5a;
                        out.wr.op = SendOp::Write {
                            remote_addr: frame.addr,
                            rkey: frame.rkey,
                            imm: (frame.flags & HAS_IMM != 0).then_some(frame.imm),
                        };
                    }
                }
                out.sent_at = Some(now);
                let link_up = self.port_error.is_none();
                if let (Some(w), true) = (wire, link_up) {
                    if let Some(wire) = self.wires[w].as_mut() {
                        wire.queue(&frame.encode(), out.payload.as_deref().unwrap_or(&[]));
                    }
                }
                let qp = self.qps.get_mut(&qpn).expect("listed");
                qp.unacked.push_back(out);
                if self.stall_until.is_some() || !link_up {
                    break;
                }
            }
        }
    }

    /// Starts the faults whose time has come.
    pub(super) fn trigger_faults(&mut self) {
        let sent = self.frames_sent;
        let due: Vec<Fault> = self
            .faults
            .iter()
            .filter(|(_, at)| sent > *at)
            .map(|(fault, _)| *fault)
            .collect();
        self.faults.retain(|(_, at)| sent <= *at);
        for fault in due {
            match fault {
                Fault::DropLink => {
                    self.port_error = Some("port 1 went down (IBV_EVENT_PORT_ERR)".into());
                    for wire in self.wires.iter_mut().flatten() {
                        wire.closed = true;
                        wire.out.clear();
                        wire.out_at = 0;
                    }
                }
                Fault::CorruptKey => self.corrupt_next = true,
                Fault::Stall(d) => self.stall_until = Some(Instant::now() + d),
            }
        }
    }
}

/// 4.096 us x 2^timeout; none for 0 (wait without end).
pub(super) fn ack_timeout(timeout: u8) -> Option<Duration> {
    (timeout > 0).then(|| Duration::from_nanos(4096 << timeout.min(31)))
}

/// Copies `payload` to `dst` so that a reader who sees its last 8 bytes
/// (as NCCL's FIFO entries end with their sequence number) sees all of it:
/// the rest first, then a fence, then those 8 bytes in one store.
///
/// # Safety
/// `dst..dst + payload.len()` is valid for writes.
pub(super) unsafe fn write_ordered(dst: *mut u8, payload: &[u8]) {
    let len = payload.len();
    let last = dst.wrapping_add(len.saturating_sub(8));
    if len >= 8 && (last as usize).is_multiple_of(8) {
        // SAFETY: `dst..dst + len` is valid for writes (the caller's
        // contract) and cannot overlap the borrowed `payload`.
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, len - 8) };
        fence(Ordering::Release);
        let word = u64::from_ne_bytes(payload[len - 8..].try_into().expect("8 bytes"));
        // SAFETY: `last` is 8-byte aligned and valid for writes (the
        // caller's range); readers of the word load it atomically.
        unsafe { AtomicU64::from_ptr(last.cast()) }.store(word, Ordering::Release);
    } else {
        // SAFETY: as above, for the whole payload.
        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, len) };
        fence(Ordering::Release);
    }
}
