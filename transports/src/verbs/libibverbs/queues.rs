//! The data path: completion queues (polled through the context's
//! operation table, armed through a completion channel) and
//! reliable-connected queue pairs (moved INIT -> RTR -> RTS, posting
//! sends and receives).

use super::*;

pub(super) struct RealCq {
    pub(super) lib: Arc<Lib>,
    pub(super) cq: *mut c_void,
    pub(super) channel: *mut c_void,
    pub(super) event_fd: c_int,
    pub(super) poll: PollCq,
    pub(super) notify: ReqNotifyCq,
}

// SAFETY: libibverbs' completion queues may be polled from any thread.
unsafe impl Send for RealCq {}
// SAFETY: as above.
unsafe impl Sync for RealCq {}

impl Drop for RealCq {
    fn drop(&mut self) {
        // SAFETY: queue pairs hold an Arc of the queue, so none is left;
        // every event was acknowledged when read (`arm`), so the queue can
        // go, then its channel.
        unsafe {
            (self.lib.destroy_cq)(self.cq);
            (self.lib.destroy_comp_channel)(self.channel);
        }
    }
}

impl CompletionQueue for RealCq {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn poll(&self, wcs: &mut [Wc]) -> Result<usize, VerbsError> {
        let mut raw = [ibv_wc::default(); 64];
        let max = wcs.len().min(raw.len());
        // SAFETY: `raw` holds `max` entries for the provider to fill.
        let n = unsafe { (self.poll)(self.cq, max as c_int, raw.as_mut_ptr()) };
        if n < 0 {
            return Err(rc_error("ibv_poll_cq", n));
        }
        for (out, wc) in wcs.iter_mut().zip(&raw[..n as usize]) {
            *out = Wc {
                wr_id: wc.wr_id,
                status: WcStatus::from_raw(wc.status),
                opcode: match wc.opcode {
                    IBV_WC_SEND => WcOpcode::Send,
                    IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                    IBV_WC_RECV => WcOpcode::Recv,
                    IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvRdmaWithImm,
                    _ => WcOpcode::Send,
                },
                byte_len: wc.byte_len,
                imm: (wc.wc_flags & IBV_WC_WITH_IMM != 0).then(|| u32::from_be(wc.imm_data)),
                qp_num: wc.qp_num,
            };
        }
        Ok(n as usize)
    }

    fn event_fd(&self) -> RawFd {
        self.event_fd
    }

    fn arm(&self) -> Result<(), VerbsError> {
        let (mut cq, mut ctx) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: the channel's fd is non-blocking, so this returns at
        // once when no event is pending; each event read is acknowledged.
        while unsafe { (self.lib.get_cq_event)(self.channel, &mut cq, &mut ctx) } == 0 {
            // SAFETY: `cq` is the queue the event was for (this one).
            unsafe { (self.lib.ack_cq_events)(cq, 1) };
        }
        // SAFETY: a live queue; 0: every completion, not only solicited.
        let rc = unsafe { (self.notify)(self.cq, 0) };
        if rc != 0 {
            return Err(rc_error("ibv_req_notify_cq", rc));
        }
        Ok(())
    }
}

pub(super) struct RealQp {
    pub(super) lib: Arc<Lib>,
    pub(super) qp: *mut c_void,
    pub(super) qpn: u32,
    pub(super) post_send_fn: PostSend,
    pub(super) post_recv_fn: PostRecv,
    pub(super) _cq: Arc<dyn CompletionQueue>,
    pub(super) events: Arc<Mutex<Events>>,
}

// SAFETY: libibverbs' queue pairs may be posted to from any thread.
unsafe impl Send for RealQp {}
// SAFETY: as above.
unsafe impl Sync for RealQp {}

impl Drop for RealQp {
    fn drop(&mut self) {
        // SAFETY: destroys once; the queue it used outlives it (`_cq`).
        unsafe { (self.lib.destroy_qp)(self.qp) };
    }
}

impl RealQp {
    pub(super) fn modify(&self, attr: &mut ibv_qp_attr, mask: c_int) -> Result<(), VerbsError> {
        // SAFETY: a live queue pair and attributes valid for `mask`.
        let rc = unsafe { (self.lib.modify_qp)(self.qp, attr, mask) };
        if rc != 0 {
            return Err(rc_error("ibv_modify_qp", rc));
        }
        Ok(())
    }
}

impl QueuePair for RealQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn init(&self, path: &PathSettings) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_INIT,
            pkey_index: 0,
            port_num: path.port,
            qp_access_flags: path.access,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        )
    }

    fn ready_to_receive(&self, remote: &RemoteQp, path: &PathSettings) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTR,
            path_mtu: u32::from(remote.mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: 1,
            min_rnr_timer: 12,
            ah_attr: ibv_ah_attr {
                grh: ibv_global_route {
                    dgid: remote.gid,
                    flow_label: 0,
                    sgid_index: path.sgid_index,
                    hop_limit: 255,
                    traffic_class: path.traffic_class,
                },
                dlid: remote.lid,
                sl: path.sl,
                src_path_bits: 0,
                static_rate: 0,
                is_global: u8::from(path.is_global),
                port_num: path.port,
            },
            ..Default::default()
        };
        self.modify(
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_AV
                | IBV_QP_PATH_MTU
                | IBV_QP_DEST_QPN
                | IBV_QP_RQ_PSN
                | IBV_QP_MAX_DEST_RD_ATOMIC
                | IBV_QP_MIN_RNR_TIMER,
        )
    }

    fn ready_to_send(&self, psn: u32, path: &PathSettings) -> Result<(), VerbsError> {
        let mut attr = ibv_qp_attr {
            qp_state: IBV_QPS_RTS,
            timeout: path.timeout,
            retry_cnt: path.retry_cnt,
            rnr_retry: path.rnr_retry,
            sq_psn: psn,
            max_rd_atomic: 1,
            ..Default::default()
        };
        self.modify(
            &mut attr,
            IBV_QP_STATE
                | IBV_QP_TIMEOUT
                | IBV_QP_RETRY_CNT
                | IBV_QP_RNR_RETRY
                | IBV_QP_SQ_PSN
                | IBV_QP_MAX_QP_RD_ATOMIC,
        )
    }

    fn post_send(&self, wrs: &[SendWr]) -> Result<(), VerbsError> {
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|wr| {
                wr.sge.map_or(ibv_sge::default(), |sge| ibv_sge {
                    addr: sge.addr,
                    length: sge.len,
                    lkey: sge.lkey,
                })
            })
            .collect();
        let mut raw: Vec<ibv_send_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(wr, sge)| {
                let (opcode, remote_addr, rkey, imm) = match wr.op {
                    SendOp::Write {
                        remote_addr,
                        rkey,
                        imm: None,
                    } => (IBV_WR_RDMA_WRITE, remote_addr, rkey, 0),
                    SendOp::Write {
                        remote_addr,
                        rkey,
                        imm: Some(imm),
                    } => (IBV_WR_RDMA_WRITE_WITH_IMM, remote_addr, rkey, imm),
                    SendOp::Send => (IBV_WR_SEND, 0, 0, 0),
                };
                ibv_send_wr {
                    wr_id: wr.wr_id,
                    next: std::ptr::null_mut(),
                    sg_list: sge,
                    num_sge: c_int::from(wr.sge.is_some()),
                    opcode: if opcode == IBV_WR_SEND && imm != 0 {
                        IBV_WR_SEND_WITH_IMM
                    } else {
                        opcode
                    },
                    send_flags: if wr.signaled { IBV_SEND_SIGNALED } else { 0 }
                        | if wr.inline { IBV_SEND_INLINE } else { 0 },
                    imm_data: imm.to_be(),
                    remote_addr,
                    rkey,
                    _wr_rest: [0; 5],
                    _qp_type: 0,
                    _bind_mw_or_tso: [0; 6],
                }
            })
            .collect();
        for i in 1..raw.len() {
            let next: *mut ibv_send_wr = &mut raw[i];
            raw[i - 1].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: a chain of valid work requests whose sges live in
        // `sges`; the provider reads them during the call (inline data is
        // copied then, other data later from registered memory).
        let rc = unsafe { (self.post_send_fn)(self.qp, raw.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(rc_error("ibv_post_send", rc));
        }
        Ok(())
    }

    fn post_recv(&self, wrs: &[RecvWr]) -> Result<(), VerbsError> {
        let mut sges: Vec<ibv_sge> = wrs
            .iter()
            .map(|wr| {
                wr.sge.map_or(ibv_sge::default(), |sge| ibv_sge {
                    addr: sge.addr,
                    length: sge.len,
                    lkey: sge.lkey,
                })
            })
            .collect();
        let mut raw: Vec<ibv_recv_wr> = wrs
            .iter()
            .zip(sges.iter_mut())
            .map(|(wr, sge)| ibv_recv_wr {
                wr_id: wr.wr_id,
                next: std::ptr::null_mut(),
                sg_list: sge,
                num_sge: c_int::from(wr.sge.is_some()),
            })
            .collect();
        for i in 1..raw.len() {
            let next: *mut ibv_recv_wr = &mut raw[i];
            raw[i - 1].next = next;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: a chain of valid receive requests whose sges live in
        // `sges` for the call.
        let rc = unsafe { (self.post_recv_fn)(self.qp, raw.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            return Err(rc_error("ibv_post_recv", rc));
        }
        Ok(())
    }

    fn async_error(&self) -> Option<String> {
        self.events
            .lock()
            .qps
            .iter()
            .find(|(qp, _)| *qp == self.qp as usize)
            .map(|(_, what)| format!("{what} on QP {:#x}", self.qpn))
    }
}
