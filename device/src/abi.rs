//! The structures the kernels take, laid out as `kernels/*.h` declares
//! them (`repr(C)`; both sides are checked by the twin's tests).

use std::ffi::c_void;
use std::ptr;

use rccl_algorithms::protocol::FIFO_CONTROL_BYTES;

/// `ncclRedOp_t` values of the built-in operators, then PreMulSum.
pub mod op {
    /// `ncclSum`
    pub const SUM: i32 = 0;
    /// `ncclProd`
    pub const PROD: i32 = 1;
    /// `ncclMax`
    pub const MAX: i32 = 2;
    /// `ncclMin`
    pub const MIN: i32 = 3;
    /// `ncclAvg`
    pub const AVG: i32 = 4;
    /// A PreMulSum operator (`ncclRedOpCreatePreMulSum`).
    pub const PRE_MUL_SUM: i32 = 5;
}

/// One reduction over `count` elements of `dtype` (`ncclDataType_t`):
/// `out = acc OP pre(input)`, or `out = pre(input)` when `acc` is null; the
/// output transform (integer Avg) applies when `finish` is 1. Mirrors
/// `rccl::ReduceArgs` in `kernels/reduce.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReduceArgs {
    pub acc: *const c_void,
    pub input: *const c_void,
    pub out: *mut c_void,
    pub count: u64,
    /// Rank count, for Avg.
    pub nranks: u64,
    /// PreMulSum's scalar in the datatype's encoding, little-endian.
    pub scalar: u64,
    /// A scalar in device memory, read instead of `scalar` when not null.
    pub scalar_ptr: *const c_void,
    pub dtype: i32,
    pub op: i32,
    pub finish: i32,
    /// 1: the input is a partial result (no input transform: PreMulSum and
    /// float Avg combine as Sum).
    pub partial: i32,
}

impl ReduceArgs {
    /// `out = acc OP input` (or the input transform alone when `acc` is
    /// null) with a host scalar.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        dtype: i32,
        op: i32,
        nranks: u64,
        scalar: [u8; 8],
        acc: *const c_void,
        input: *const c_void,
        out: *mut c_void,
        count: u64,
        finish: bool,
    ) -> ReduceArgs {
        ReduceArgs {
            acc,
            input,
            out,
            count,
            nranks,
            scalar: u64::from_le_bytes(scalar),
            scalar_ptr: ptr::null(),
            dtype,
            op,
            finish: i32::from(finish),
            partial: 0,
        }
    }
}

/// One FIFO laid out as rccl-transports' `Fifo` lays it out. Mirrors
/// `rccl::FifoView` in `kernels/fifo.h`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FifoView {
    /// The FIFO's control block (its counters).
    pub base: *mut u8,
    /// Its first slot: `base` + [`FIFO_CONTROL_BYTES`] when laid out
    /// whole; elsewhere when the slots are device memory a NIC writes.
    pub slots: *mut u8,
    /// The protocol ([`rccl_algorithms::Protocol::abi`]).
    pub proto: u32,
    pub nslots: u32,
    pub slot_bytes: u32,
    pub pad: u32,
}

impl FifoView {
    /// A FIFO laid out whole at `base`: the control block, then the slots.
    pub fn whole(base: *mut u8, proto: u32, nslots: u32, slot_bytes: u32) -> FifoView {
        FifoView {
            base,
            slots: base.wrapping_add(FIFO_CONTROL_BYTES),
            proto,
            nslots,
            slot_bytes,
            pad: 0,
        }
    }
}

/// The FIFO loopback kernel's arguments (`rccl_fifo_loopback` in
/// `kernels/kernels.cu`): `bytes` of `src` sent through `fifo` by one warp
/// and received into `dst` by another; `status` (two `u32` of device
/// memory, zeroed) gets the pieces received and an error mask (bit 0: a
/// wait gave up after `spins` polls, bit 1: a piece out of order).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LoopbackArgs {
    pub fifo: FifoView,
    pub src: u64,
    pub dst: u64,
    pub bytes: u64,
    pub spins: u64,
    pub status: u64,
}
