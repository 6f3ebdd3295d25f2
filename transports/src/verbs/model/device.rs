//! The verbs objects the model hands out: its device (registrations,
//! queues) and its queue pairs, each a handle on the NIC's state.

use super::*;

pub(super) struct ModelDevice {
    pub(super) nic: Arc<Nic>,
}

impl Device for ModelDevice {
    unsafe fn reg_mr(
        &self,
        addr: *mut u8,
        len: usize,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        let region = Region {
            addr: addr as usize,
            len,
            access: access | ACCESS_LOCAL_WRITE,
            at: addr as usize,
        };
        Ok(register(&self.nic, region, None))
    }

    unsafe fn reg_dmabuf_mr(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: u32,
    ) -> Result<Box<dyn MemoryRegion>, VerbsError> {
        if !self.registers_dmabuf() {
            return Err(VerbsError::new(
                "ibv_reg_dmabuf_mr",
                format!("the model takes dma-bufs only with {GPU_DIRECT_ENV}=1 (EOPNOTSUPP)"),
            ));
        }
        // The model reaches the buffer as a NIC does: through the file.
        let mapping = map_dmabuf(fd, offset, len)?;
        let region = Region {
            addr: iova as usize,
            len,
            access: access | ACCESS_LOCAL_WRITE,
            at: mapping.bytes(),
        };
        Ok(register(&self.nic, region, Some(mapping)))
    }

    fn registers_dmabuf(&self) -> bool {
        gpu_direct()
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<dyn CompletionQueue>, VerbsError> {
        // SAFETY: plain eventfd(2) call; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(VerbsError::new(
                "ibv_create_comp_channel",
                io::Error::last_os_error().to_string(),
            ));
        }
        Ok(Arc::new(ModelCq {
            state: Arc::new(Mutex::new(CqState {
                entries: VecDeque::new(),
                depth: depth as usize,
                overflowed: false,
                // SAFETY: `fd` is a fresh descriptor nobody else owns.
                event: unsafe { OwnedFd::from_raw_fd(fd) },
            })),
        }))
    }

    fn create_qp(
        &self,
        cq: &Arc<dyn CompletionQueue>,
        caps: QpCaps,
    ) -> Result<Box<dyn QueuePair>, VerbsError> {
        let cq = cq
            .as_any()
            .downcast_ref::<ModelCq>()
            .ok_or_else(|| VerbsError::new("ibv_create_qp", "not a completion queue of the model"))?
            .state
            .clone();
        let mut state = self.nic.state.lock();
        let qpn = state.next_qpn & 0xff_ffff;
        state.next_qpn = state.next_qpn.wrapping_add(1);
        state.qps.insert(
            qpn,
            Qp {
                state: QpState::Reset,
                cq,
                caps,
                path: None,
                unacked: VecDeque::new(),
                queued: VecDeque::new(),
                recvs: VecDeque::new(),
                next_psn: 0,
                expect_psn: 0,
                retries_left: 0,
                rnr_left: 0,
                resend_at: None,
                wire: None,
                fatal: None,
            },
        );
        Ok(Box::new(ModelQp {
            nic: self.nic.clone(),
            qpn,
        }))
    }

    fn async_error(&self) -> Option<String> {
        self.nic.state.lock().port_error.clone()
    }
}

pub(super) struct ModelQp {
    pub(super) nic: Arc<Nic>,
    pub(super) qpn: u32,
}

impl ModelQp {
    pub(super) fn with<T>(
        &self,
        call: &'static str,
        f: impl FnOnce(&mut NicState, &mut Qp) -> Result<T, VerbsError>,
    ) -> Result<T, VerbsError> {
        let mut state = self.nic.state.lock();
        let mut qp = state
            .qps
            .remove(&self.qpn)
            .ok_or_else(|| VerbsError::new(call, "no such queue pair"))?;
        let result = f(&mut state, &mut qp);
        state.qps.insert(self.qpn, qp);
        drop(state);
        self.nic.ring();
        result
    }
}

pub(super) fn wrong_state(call: &'static str, state: QpState) -> VerbsError {
    VerbsError::new(call, format!("the queue pair is in state {state:?}"))
}

impl QueuePair for ModelQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn init(&self, path: &PathSettings) -> Result<(), VerbsError> {
        self.with("ibv_modify_qp", |_, qp| {
            if qp.state != QpState::Reset || path.port != 1 {
                return Err(wrong_state("ibv_modify_qp", qp.state));
            }
            qp.state = QpState::Init;
            qp.path = Some(*path);
            Ok(())
        })
    }

    fn ready_to_receive(&self, remote: &RemoteQp, path: &PathSettings) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.with("ibv_modify_qp", |state, qp| {
            if qp.state != QpState::Init {
                return Err(wrong_state("ibv_modify_qp", qp.state));
            }
            qp.state = QpState::Rtr;
            qp.path = Some(*path);
            qp.expect_psn = remote.psn & PSN_MASK;
            // An address the model cannot reach is a path nothing answers
            // on: sends time out, as on a fabric.
            if let Some(addr) = route(&remote.gid) {
                match start_connect(None, SocketAddr::V4(addr)) {
                    Ok(stream) => {
                        let mut wire = Wire {
                            stream,
                            qpn: Some(qpn),
                            outgoing: true,
                            peer: addr.to_string(),
                            out: Vec::new(),
                            out_at: 0,
                            inbuf: Vec::new(),
                            closed: false,
                        };
                        let hello = Frame {
                            kind: HELLO,
                            qpn: remote.qpn,
                            src_qpn: qpn,
                            ..Frame::default()
                        };
                        wire.queue(&hello.encode(), &[]);
                        qp.wire = Some(state.add_wire(wire));
                    }
                    Err(e) => {
                        qp.fatal = Some(format!("cannot reach {addr}: {e}"));
                    }
                }
            }
            Ok(())
        })
    }

    fn ready_to_send(&self, psn: u32, path: &PathSettings) -> Result<(), VerbsError> {
        self.with("ibv_modify_qp", |_, qp| {
            if qp.state != QpState::Rtr {
                return Err(wrong_state("ibv_modify_qp", qp.state));
            }
            qp.state = QpState::Rts;
            qp.next_psn = psn & PSN_MASK;
            qp.retries_left = path.retry_cnt;
            qp.rnr_left = path.rnr_retry;
            qp.path = Some(*path);
            Ok(())
        })
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.with("ibv_post_send", |state, qp| {
            if qp.state == QpState::Error {
                for wr in wrs {
                    qp.complete(flush(wr.wr_id, send_opcode(wr), qpn));
                }
                return Ok(());
            }
            if qp.state != QpState::Rts {
                return Err(wrong_state("ibv_post_send", qp.state));
            }
            if qp.unacked.len() + qp.queued.len() + wrs.len() > qp.caps.max_send_wr as usize {
                return Err(VerbsError::new(
                    "ibv_post_send",
                    "the send queue is full (ENOMEM)",
                ));
            }
            for wr in wrs {
                let payload = match (wr.inline, wr.sge) {
                    (true, Some(sge)) => {
                        if sge.len > qp.caps.max_inline {
                            return Err(VerbsError::new(
                                "ibv_post_send",
                                format!("{} bytes inline exceed {}", sge.len, qp.caps.max_inline),
                            ));
                        }
                        // SAFETY: an inline send's bytes are valid for
                        // reads while it is posted (the caller's buffer).
                        let bytes = unsafe {
                            std::slice::from_raw_parts(sge.addr as *const u8, sge.len as usize)
                        };
                        Some(bytes.to_vec())
                    }
                    _ => None,
                };
                qp.queued.push_back(Outstanding {
                    wr: *wr,
                    psn: qp.next_psn,
                    payload,
                    sent_at: None,
                    sent_once: false,
                });
                qp.next_psn = psn_after(qp.next_psn);
            }
            let _ = state;
            Ok(())
        })
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), VerbsError> {
        let qpn = self.qpn;
        self.with("ibv_post_recv", |_, qp| {
            match qp.state {
                QpState::Reset => return Err(wrong_state("ibv_post_recv", qp.state)),
                QpState::Error => {
                    for wr in wrs {
                        qp.complete(flush(wr.wr_id, WcOpcode::Recv, qpn));
                    }
                    return Ok(());
                }
                _ => {}
            }
            if qp.recvs.len() + wrs.len() > qp.caps.max_recv_wr as usize {
                return Err(VerbsError::new(
                    "ibv_post_recv",
                    "the receive queue is full (ENOMEM)",
                ));
            }
            qp.recvs.extend(wrs.iter().copied());
            Ok(())
        })
    }

    fn async_error(&self) -> Option<String> {
        let state = self.nic.state.lock();
        if let Some(port) = &state.port_error {
            return Some(port.clone());
        }
        let qp = state.qps.get(&self.qpn)?;
        if let Some(fatal) = &qp.fatal {
            return Some(fatal.clone());
        }
        let overflowed = qp.cq.lock().overflowed;
        overflowed.then(|| "the completion queue overflowed (IBV_EVENT_CQ_ERR)".to_string())
    }
}

impl Drop for ModelQp {
    fn drop(&mut self) {
        let mut state = self.nic.state.lock();
        if let Some(qp) = state.qps.remove(&self.qpn) {
            if let Some(w) = qp.wire {
                state.wires[w] = None;
            }
        }
        let qpn = self.qpn;
        for wire in state.wires.iter_mut() {
            if wire
                .as_ref()
                .is_some_and(|w| !w.outgoing && w.qpn == Some(qpn))
            {
                *wire = None;
            }
        }
    }
}
