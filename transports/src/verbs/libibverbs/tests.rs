//! The binding's layouts against rdma-core's header, and what it reads
//! from a port.

use super::*;
use std::mem::{offset_of, size_of};

/// A row of the table below: the C expression and our value.
macro_rules! size {
    ($ty:ident) => {
        (
            concat!("sizeof(struct ", stringify!($ty), ")"),
            size_of::<$ty>(),
        )
    };
}
macro_rules! offset {
    ($ty:ident, $field:ident) => {
        (
            concat!(
                "offsetof(struct ",
                stringify!($ty),
                ", ",
                stringify!($field),
                ")"
            ),
            offset_of!($ty, $field),
        )
    };
}
macro_rules! constant {
    ($name:ident) => {
        (stringify!($name), $name as usize)
    };
}

/// Every size, offset and constant used above, as the C compiler sees
/// them in rdma-core's header (skipped where the header or a C
/// compiler is missing; CI installs libibverbs-dev).
#[test]
fn layouts_match_rdma_core_headers() {
    let header = std::path::Path::new("/usr/include/infiniband/verbs.h");
    if !header.exists() {
        eprintln!("skipped: {} is not installed", header.display());
        return;
    }
    let ours: Vec<(&str, usize)> = vec![
        size!(ibv_qp_cap),
        size!(ibv_qp_init_attr),
        offset!(ibv_qp_init_attr, cap),
        offset!(ibv_qp_init_attr, qp_type),
        size!(ibv_global_route),
        size!(ibv_ah_attr),
        offset!(ibv_ah_attr, dlid),
        offset!(ibv_ah_attr, port_num),
        size!(ibv_qp_attr),
        offset!(ibv_qp_attr, dest_qp_num),
        offset!(ibv_qp_attr, ah_attr),
        offset!(ibv_qp_attr, pkey_index),
        offset!(ibv_qp_attr, min_rnr_timer),
        offset!(ibv_qp_attr, timeout),
        offset!(ibv_qp_attr, rnr_retry),
        offset!(ibv_qp_attr, rate_limit),
        size!(ibv_sge),
        size!(ibv_send_wr),
        offset!(ibv_send_wr, imm_data),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.remote_addr)",
            offset_of!(ibv_send_wr, remote_addr),
        ),
        (
            "offsetof(struct ibv_send_wr, wr.rdma.rkey)",
            offset_of!(ibv_send_wr, rkey),
        ),
        size!(ibv_recv_wr),
        size!(ibv_wc),
        offset!(ibv_wc, imm_data),
        offset!(ibv_wc, wc_flags),
        size!(ibv_async_event),
        ("sizeof(struct ibv_port_attr)", PORT_ATTR_BYTES),
        (
            "offsetof(struct ibv_port_attr, active_mtu)",
            PORT_ATTR_ACTIVE_MTU,
        ),
        (
            "offsetof(struct ibv_port_attr, gid_tbl_len)",
            PORT_ATTR_GID_TBL_LEN,
        ),
        ("offsetof(struct ibv_port_attr, lid)", PORT_ATTR_LID),
        (
            "offsetof(struct ibv_port_attr, active_width)",
            PORT_ATTR_ACTIVE_WIDTH,
        ),
        (
            "offsetof(struct ibv_port_attr, active_speed)",
            PORT_ATTR_ACTIVE_SPEED,
        ),
        (
            "offsetof(struct ibv_port_attr, link_layer)",
            PORT_ATTR_LINK_LAYER,
        ),
        ("offsetof(struct ibv_mr, lkey)", MR_LKEY),
        ("offsetof(struct ibv_mr, rkey)", MR_RKEY),
        ("offsetof(struct ibv_qp, qp_num)", QP_NUM),
        ("offsetof(struct ibv_context, async_fd)", CONTEXT_ASYNC_FD),
        ("offsetof(struct ibv_context, ops.poll_cq)", OPS_POLL_CQ),
        (
            "offsetof(struct ibv_context, ops.req_notify_cq)",
            OPS_REQ_NOTIFY_CQ,
        ),
        ("offsetof(struct ibv_comp_channel, fd)", COMP_CHANNEL_FD),
        ("offsetof(struct ibv_context, ops.post_send)", OPS_POST_SEND),
        ("offsetof(struct ibv_context, ops.post_recv)", OPS_POST_RECV),
        constant!(IBV_QPT_RC),
        constant!(IBV_QPS_INIT),
        constant!(IBV_QPS_RTR),
        constant!(IBV_QPS_RTS),
        constant!(IBV_QP_STATE),
        constant!(IBV_QP_ACCESS_FLAGS),
        constant!(IBV_QP_PKEY_INDEX),
        constant!(IBV_QP_PORT),
        constant!(IBV_QP_AV),
        constant!(IBV_QP_PATH_MTU),
        constant!(IBV_QP_TIMEOUT),
        constant!(IBV_QP_RETRY_CNT),
        constant!(IBV_QP_RNR_RETRY),
        constant!(IBV_QP_RQ_PSN),
        constant!(IBV_QP_MAX_QP_RD_ATOMIC),
        constant!(IBV_QP_MIN_RNR_TIMER),
        constant!(IBV_QP_SQ_PSN),
        constant!(IBV_QP_MAX_DEST_RD_ATOMIC),
        constant!(IBV_QP_DEST_QPN),
        constant!(IBV_WR_RDMA_WRITE),
        constant!(IBV_WR_RDMA_WRITE_WITH_IMM),
        constant!(IBV_WR_SEND),
        constant!(IBV_WR_SEND_WITH_IMM),
        constant!(IBV_SEND_SIGNALED),
        constant!(IBV_SEND_INLINE),
        constant!(IBV_WC_WITH_IMM),
        constant!(IBV_WC_SEND),
        constant!(IBV_WC_RDMA_WRITE),
        constant!(IBV_WC_RECV),
        constant!(IBV_WC_RECV_RDMA_WITH_IMM),
        constant!(IBV_LINK_LAYER_ETHERNET),
        constant!(IBV_PORT_ACTIVE),
        ("IBV_WC_WR_FLUSH_ERR", WcStatus::Flush.raw() as usize),
        (
            "IBV_WC_REM_ACCESS_ERR",
            WcStatus::RemoteAccess.raw() as usize,
        ),
        (
            "IBV_WC_RETRY_EXC_ERR",
            WcStatus::RetryExceeded.raw() as usize,
        ),
        (
            "IBV_WC_RNR_RETRY_EXC_ERR",
            WcStatus::RnrRetryExceeded.raw() as usize,
        ),
        (
            "IBV_WC_LOC_PROT_ERR",
            WcStatus::LocalProtection.raw() as usize,
        ),
        ("IBV_WC_LOC_LEN_ERR", WcStatus::LocalLength.raw() as usize),
        ("IBV_EVENT_QP_FATAL", 1),
        ("IBV_EVENT_QP_ACCESS_ERR", 3),
        ("IBV_EVENT_DEVICE_FATAL", 8),
        ("IBV_EVENT_PORT_ERR", 10),
        (
            "IBV_ACCESS_LOCAL_WRITE",
            crate::verbs::ACCESS_LOCAL_WRITE as usize,
        ),
        (
            "IBV_ACCESS_REMOTE_WRITE",
            crate::verbs::ACCESS_REMOTE_WRITE as usize,
        ),
        (
            "IBV_ACCESS_REMOTE_READ",
            crate::verbs::ACCESS_REMOTE_READ as usize,
        ),
        // The signature `Lib::reg_dmabuf_mr` repeats (1: the same).
        (
            "__builtin_types_compatible_p(__typeof__(&ibv_reg_dmabuf_mr), \
             struct ibv_mr *(*)(struct ibv_pd *, uint64_t, size_t, uint64_t, int, int))",
            1,
        ),
    ];
    let dir = std::env::temp_dir().join(format!("rccl-verbs-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut program = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n",
    );
    for (expr, _) in &ours {
        program.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    program.push_str("  return 0;\n}\n");
    let source = dir.join("layout.c");
    let binary = dir.join("layout");
    std::fs::write(&source, program).unwrap();
    let built = std::process::Command::new("cc")
        .arg(&source)
        .arg("-o")
        .arg(&binary)
        .status();
    match built {
        Ok(status) if status.success() => {}
        other => {
            eprintln!("skipped: no C compiler could build the layout probe ({other:?})");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
    }
    let output = std::process::Command::new(&binary).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let theirs: Vec<usize> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| line.parse().unwrap())
        .collect();
    assert_eq!(theirs.len(), ours.len());
    let wrong: Vec<String> = ours
        .iter()
        .zip(&theirs)
        .filter(|((_, ours), theirs)| ours != *theirs)
        .map(|((expr, ours), theirs)| format!("{expr}: ours {ours}, verbs.h {theirs}"))
        .collect();
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn port_speeds_follow_nccl_tables() {
    // 4x EDR, 4x HDR, 4x NDR, 1x HDR.
    assert_eq!(speed_mbps(2, 32), 100_000);
    assert_eq!(speed_mbps(2, 64), 200_000);
    assert_eq!(speed_mbps(2, 128), 400_000);
    assert_eq!(speed_mbps(1, 64), 50_000);
}

/// On a machine without an RDMA device (or without the library), the
/// binding says why instead of failing in another way.
#[test]
fn no_device_says_why() {
    match Libibverbs::open() {
        Ok(verbs) => assert!(!verbs.devices().is_empty()),
        Err(why) => assert!(
            why.contains(LIBRARY)
                || why.contains("no RDMA device")
                || why.contains("ibv_get_device_list"),
            "{why}"
        ),
    }
}
