//! The tag a call's pieces carry (sequence number, kind, datatype, op,
//! root and count), and how a mismatch between two ranks' calls is told.

use rccl_algorithms::CollKind;
use rccl_transports::Tag;

use crate::error::Error;
use crate::types::{DataType, RedOp};

/// The tag of pieces of batched sends and receives: any send meets any
/// receive, so only the kind of operation is checked.
pub(crate) const P2P_CALL: u32 = 0xf;

/// Packs a collective call into the tag its pieces carry.
pub(crate) fn call_tag(
    seq: u64,
    kind: CollKind,
    count: usize,
    dtype: DataType,
    op: RedOp,
    root: usize,
) -> Tag {
    let kind_code = CollKind::ALL.iter().position(|&k| k == kind).unwrap_or(0) as u32;
    let op_code = match op {
        RedOp::Sum => 0,
        RedOp::Prod => 1,
        RedOp::Max => 2,
        RedOp::Min => 3,
        RedOp::Avg => 4,
        RedOp::PreMulSum { .. } | RedOp::PreMulSumDevice { .. } => 5,
    };
    Tag {
        seq: seq as u32,
        call: kind_code | (dtype as u32) << 4 | op_code << 8 | ((root as u32) & 0xf_ffff) << 12,
        count: count as u32,
    }
}

/// Describes the call a tag was packed from, for mismatch errors.
pub(crate) fn describe_call(tag: Tag) -> String {
    let kind_code = (tag.call & 0xf) as usize;
    if tag.call == P2P_CALL {
        return "Send/Recv".to_string();
    }
    let Some(kind) = CollKind::ALL.get(kind_code) else {
        return format!("an unknown call ({:#x})", tag.call);
    };
    let dtype = DataType::from_raw(((tag.call >> 4) & 0xf) as i32)
        .map(DataType::name)
        .unwrap_or("?");
    let op = ["sum", "prod", "max", "min", "avg", "premulsum"]
        .get(((tag.call >> 8) & 0xf) as usize)
        .copied()
        .unwrap_or("?");
    let mut text = format!("{} #{} (count {}, {dtype}", kind.name(), tag.seq, tag.count);
    if kind.reduces() {
        text += &format!(", {op}");
    }
    if kind.has_root() {
        text += &format!(", root {}", tag.call >> 12);
    }
    text + ")"
}

/// The error of a rank that runs `mine` while `peer` (described) runs
/// `theirs`.
pub(crate) fn disagreement(mine: Tag, peer: &str, theirs: Tag) -> Error {
    Error::InvalidUsage(format!(
        "ranks disagree on the operation: this rank called {} but {peer} called {}",
        describe_call(mine),
        describe_call(theirs)
    ))
}
