//! A queue pair as the model's NIC keeps it: its state, its path to the
//! peer, and the work requests it still owes.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Error,
}

/// A send work request in the model's hands.
pub(super) struct Outstanding {
    pub(super) wr: SendWr,
    pub(super) psn: u32,
    /// The bytes, copied at posting (inline) or at first sending.
    pub(super) payload: Option<Vec<u8>>,
    pub(super) sent_at: Option<Instant>,
    /// Sent at least once (later sends are retransmissions).
    pub(super) sent_once: bool,
}

pub(super) struct Qp {
    pub(super) state: QpState,
    pub(super) cq: Arc<Mutex<CqState>>,
    pub(super) caps: QpCaps,
    pub(super) path: Option<PathSettings>,
    /// Sent, not acknowledged, in order.
    pub(super) unacked: VecDeque<Outstanding>,
    /// Posted, not sent yet (or to send again), in order.
    pub(super) queued: VecDeque<Outstanding>,
    pub(super) recvs: VecDeque<RecvWr>,
    pub(super) next_psn: u32,
    pub(super) expect_psn: u32,
    pub(super) retries_left: u8,
    pub(super) rnr_left: u8,
    pub(super) resend_at: Option<Instant>,
    /// The stream this queue pair sends on.
    pub(super) wire: Option<usize>,
    pub(super) fatal: Option<String>,
}

impl Qp {
    pub(super) fn complete(&self, wc: Wc) {
        complete(&self.cq, wc);
    }

    /// Puts the queue pair in error and flushes every work request.
    pub(super) fn enter_error(&mut self, qpn: u32) {
        self.state = QpState::Error;
        let flushed: Vec<_> = self
            .unacked
            .drain(..)
            .chain(self.queued.drain(..))
            .collect();
        for out in flushed {
            self.complete(flush(out.wr.wr_id, send_opcode(&out.wr), qpn));
        }
        for recv in std::mem::take(&mut self.recvs) {
            self.complete(flush(recv.wr_id, WcOpcode::Recv, qpn));
        }
    }

    /// Fails the oldest unacknowledged request with `status`, then the
    /// queue pair.
    pub(super) fn fail(&mut self, qpn: u32, status: WcStatus) {
        if let Some(out) = self.unacked.pop_front().or_else(|| self.queued.pop_front()) {
            self.complete(Wc {
                wr_id: out.wr.wr_id,
                status,
                opcode: send_opcode(&out.wr),
                byte_len: 0,
                imm: None,
                qp_num: qpn,
            });
        }
        self.enter_error(qpn);
    }

    /// Acknowledges everything up to `psn`.
    pub(super) fn acknowledge(&mut self, qpn: u32, psn: u32) {
        while self
            .unacked
            .front()
            .is_some_and(|out| psn_distance(psn, out.psn) >= 0)
        {
            let out = self.unacked.pop_front().expect("just seen");
            if out.wr.signaled {
                self.complete(Wc {
                    wr_id: out.wr.wr_id,
                    status: WcStatus::Success,
                    opcode: send_opcode(&out.wr),
                    byte_len: out.wr.sge.map_or(0, |sge| sge.len),
                    imm: None,
                    qp_num: qpn,
                });
            }
            if let Some(path) = &self.path {
                self.retries_left = path.retry_cnt;
                self.rnr_left = path.rnr_retry;
            }
        }
    }

    /// Sends every unacknowledged frame again, from the first.
    pub(super) fn go_back(&mut self) {
        while let Some(mut out) = self.unacked.pop_back() {
            out.sent_at = None;
            self.queued.push_front(out);
        }
    }
}

pub(super) fn send_opcode(wr: &SendWr) -> WcOpcode {
    match wr.op {
        SendOp::Write { .. } => WcOpcode::RdmaWrite,
        SendOp::Send => WcOpcode::Send,
    }
}

pub(super) fn flush(wr_id: u64, opcode: WcOpcode, qpn: u32) -> Wc {
    Wc {
        wr_id,
        status: WcStatus::Flush,
        opcode,
        byte_len: 0,
        imm: None,
        qp_num: qpn,
    }
}
