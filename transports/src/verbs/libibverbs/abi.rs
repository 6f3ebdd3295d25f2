//! The `repr(C)` structures, constants and data-path entry types of
//! rdma-core's `<infiniband/verbs.h>` that the binding uses, as the header
//! lays them out (the tests compare each size and offset with the C
//! compiler's).

use std::ffi::c_int;
use std::ffi::c_void;

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_qp_cap {
    pub(super) max_send_wr: u32,
    pub(super) max_recv_wr: u32,
    pub(super) max_send_sge: u32,
    pub(super) max_recv_sge: u32,
    pub(super) max_inline_data: u32,
}

#[repr(C)]
pub(super) struct ibv_qp_init_attr {
    pub(super) qp_context: *mut c_void,
    pub(super) send_cq: *mut c_void,
    pub(super) recv_cq: *mut c_void,
    pub(super) srq: *mut c_void,
    pub(super) cap: ibv_qp_cap,
    pub(super) qp_type: u32,
    pub(super) sq_sig_all: c_int,
}

/// `union ibv_gid` holds two `u64`s, so the route is 8-aligned.
#[repr(C, align(8))]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_global_route {
    pub(super) dgid: [u8; 16],
    pub(super) flow_label: u32,
    pub(super) sgid_index: u8,
    pub(super) hop_limit: u8,
    pub(super) traffic_class: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_ah_attr {
    pub(super) grh: ibv_global_route,
    pub(super) dlid: u16,
    pub(super) sl: u8,
    pub(super) src_path_bits: u8,
    pub(super) static_rate: u8,
    pub(super) is_global: u8,
    pub(super) port_num: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_qp_attr {
    pub(super) qp_state: u32,
    pub(super) cur_qp_state: u32,
    pub(super) path_mtu: u32,
    pub(super) path_mig_state: u32,
    pub(super) qkey: u32,
    pub(super) rq_psn: u32,
    pub(super) sq_psn: u32,
    pub(super) dest_qp_num: u32,
    pub(super) qp_access_flags: u32,
    pub(super) cap: ibv_qp_cap,
    pub(super) ah_attr: ibv_ah_attr,
    pub(super) alt_ah_attr: ibv_ah_attr,
    pub(super) pkey_index: u16,
    pub(super) alt_pkey_index: u16,
    pub(super) en_sqd_async_notify: u8,
    pub(super) sq_draining: u8,
    pub(super) max_rd_atomic: u8,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) min_rnr_timer: u8,
    pub(super) port_num: u8,
    pub(super) timeout: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) alt_port_num: u8,
    pub(super) alt_timeout: u8,
    pub(super) rate_limit: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_sge {
    pub(super) addr: u64,
    pub(super) length: u32,
    pub(super) lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ibv_send_wr {
    pub(super) wr_id: u64,
    pub(super) next: *mut ibv_send_wr,
    pub(super) sg_list: *mut ibv_sge,
    pub(super) num_sge: c_int,
    pub(super) opcode: u32,
    pub(super) send_flags: u32,
    /// Network byte order.
    pub(super) imm_data: u32,
    /// `wr.rdma`: remote address, then key (the union is 32 bytes).
    pub(super) remote_addr: u64,
    pub(super) rkey: u32,
    pub(super) _wr_rest: [u32; 5],
    pub(super) _qp_type: u32,
    pub(super) _bind_mw_or_tso: [u64; 6],
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ibv_recv_wr {
    pub(super) wr_id: u64,
    pub(super) next: *mut ibv_recv_wr,
    pub(super) sg_list: *mut ibv_sge,
    pub(super) num_sge: c_int,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(super) struct ibv_wc {
    pub(super) wr_id: u64,
    pub(super) status: u32,
    pub(super) opcode: u32,
    pub(super) vendor_err: u32,
    pub(super) byte_len: u32,
    pub(super) imm_data: u32,
    pub(super) qp_num: u32,
    pub(super) src_qp: u32,
    pub(super) wc_flags: u32,
    pub(super) pkey_index: u16,
    pub(super) slid: u16,
    pub(super) sl: u8,
    pub(super) dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct ibv_async_event {
    pub(super) element: *mut c_void,
    pub(super) event_type: u32,
}

/// Offsets into structures the provider only reads a field of.
pub(super) const PORT_ATTR_BYTES: usize = 52;
pub(super) const PORT_ATTR_GID_TBL_LEN: usize = 12;
pub(super) const PORT_ATTR_LID: usize = 34;
pub(super) const PORT_ATTR_ACTIVE_WIDTH: usize = 43;
pub(super) const PORT_ATTR_ACTIVE_SPEED: usize = 44;
pub(super) const PORT_ATTR_LINK_LAYER: usize = 46;
pub(super) const PORT_ATTR_ACTIVE_MTU: usize = 8;
pub(super) const MR_LKEY: usize = 36;
pub(super) const MR_RKEY: usize = 40;
pub(super) const QP_NUM: usize = 52;
pub(super) const CONTEXT_ASYNC_FD: usize = 268;
pub(super) const OPS_POLL_CQ: usize = 96;
pub(super) const OPS_REQ_NOTIFY_CQ: usize = 104;
pub(super) const COMP_CHANNEL_FD: usize = 8;
pub(super) const OPS_POST_SEND: usize = 208;
pub(super) const OPS_POST_RECV: usize = 216;

pub(super) const IBV_QPT_RC: u32 = 2;
pub(super) const IBV_QPS_INIT: u32 = 1;
pub(super) const IBV_QPS_RTR: u32 = 2;
pub(super) const IBV_QPS_RTS: u32 = 3;
pub(super) const IBV_QP_STATE: c_int = 1;
pub(super) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(super) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(super) const IBV_QP_PORT: c_int = 1 << 5;
pub(super) const IBV_QP_AV: c_int = 1 << 7;
pub(super) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(super) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(super) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(super) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(super) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(super) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(super) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(super) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(super) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(super) const IBV_QP_DEST_QPN: c_int = 1 << 20;
pub(super) const IBV_WR_RDMA_WRITE: u32 = 0;
pub(super) const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub(super) const IBV_WR_SEND: u32 = 2;
pub(super) const IBV_WR_SEND_WITH_IMM: u32 = 3;
pub(super) const IBV_SEND_SIGNALED: u32 = 2;
pub(super) const IBV_SEND_INLINE: u32 = 8;
pub(super) const IBV_WC_WITH_IMM: u32 = 2;
pub(super) const IBV_WC_SEND: u32 = 0;
pub(super) const IBV_WC_RDMA_WRITE: u32 = 1;
pub(super) const IBV_WC_RECV: u32 = 128;
pub(super) const IBV_WC_RECV_RDMA_WITH_IMM: u32 = 129;
pub(super) const IBV_LINK_LAYER_ETHERNET: u8 = 2;
pub(super) const IBV_PORT_ACTIVE: u32 = 4;

pub(super) type PollCq = unsafe extern "C" fn(*mut c_void, c_int, *mut ibv_wc) -> c_int;
pub(super) type ReqNotifyCq = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
pub(super) type PostSend =
    unsafe extern "C" fn(*mut c_void, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int;
pub(super) type PostRecv =
    unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int;
