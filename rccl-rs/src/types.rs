//! Datatypes and reduction operators, with NCCL's enum values, and what
//! an operation does.

use rccl_algorithms::CollKind;

use crate::error::{Error, Result};

/// An element type, with `ncclDataType_t`'s values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum DataType {
    /// `ncclInt8` (also `ncclChar`)
    Int8 = 0,
    /// `ncclUint8`
    Uint8 = 1,
    /// `ncclInt32` (also `ncclInt`)
    Int32 = 2,
    /// `ncclUint32`
    Uint32 = 3,
    /// `ncclInt64`
    Int64 = 4,
    /// `ncclUint64`
    Uint64 = 5,
    /// `ncclFloat16` (also `ncclHalf`): IEEE binary16
    Float16 = 6,
    /// `ncclFloat32` (also `ncclFloat`)
    Float32 = 7,
    /// `ncclFloat64` (also `ncclDouble`)
    Float64 = 8,
    /// `ncclBfloat16`
    Bfloat16 = 9,
    /// `ncclFloat8e4m3`: 4 exponent bits, 3 mantissa bits, no infinities
    Float8e4m3 = 10,
    /// `ncclFloat8e5m2`: 5 exponent bits, 2 mantissa bits
    Float8e5m2 = 11,
}

impl DataType {
    /// Every datatype, in enum order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8e4m3,
        DataType::Float8e5m2,
    ];

    /// The datatype with `ncclDataType_t` value `raw`.
    pub fn from_raw(raw: i32) -> Result<DataType> {
        DataType::ALL
            .get(usize::try_from(raw).unwrap_or(usize::MAX))
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("unknown datatype {raw}")))
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8e4m3 | DataType::Float8e5m2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// Whether the type is a floating-point type.
    pub fn is_float(self) -> bool {
        !matches!(
            self,
            DataType::Int8
                | DataType::Uint8
                | DataType::Int32
                | DataType::Uint32
                | DataType::Int64
                | DataType::Uint64
        )
    }

    /// The short name nccl-tests prints (`float`, `bfloat16`, `int32`, ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8e4m3 => "f8e4m3",
            DataType::Float8e5m2 => "f8e5m2",
        }
    }
}

/// A reduction operator.
///
/// `PreMulSum` multiplies each rank's input by a scalar before summing; the
/// scalar is stored in the datatype's own encoding, little-endian, in the low
/// bytes of `scalar`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RedOp {
    /// `ncclSum`
    Sum,
    /// `ncclProd`
    Prod,
    /// `ncclMax`
    Max,
    /// `ncclMin`
    Min,
    /// `ncclAvg`: the sum divided by the rank count.
    Avg,
    /// A `ncclRedOpCreatePreMulSum` operator: sum of `scalar * input`.
    PreMulSum {
        /// The scalar's bytes, in the datatype's encoding.
        scalar: [u8; 8],
    },
    /// A `ncclRedOpCreatePreMulSum` operator whose scalar
    /// (`ncclScalarDevice`) is in device memory: device work reads it when
    /// the collective runs, in its stream's order.
    PreMulSumDevice {
        /// The scalar's device address.
        scalar: usize,
    },
}

impl RedOp {
    /// The built-in operator with `ncclRedOp_t` value `raw` (0..=4).
    pub fn from_raw(raw: i32) -> Result<RedOp> {
        match raw {
            0 => Ok(RedOp::Sum),
            1 => Ok(RedOp::Prod),
            2 => Ok(RedOp::Max),
            3 => Ok(RedOp::Min),
            4 => Ok(RedOp::Avg),
            _ => Err(Error::InvalidArgument(format!(
                "unknown reduction op {raw}"
            ))),
        }
    }

    /// The short name nccl-tests prints (`sum`, `prod`, ...).
    pub fn name(self) -> &'static str {
        match self {
            RedOp::Sum => "sum",
            RedOp::Prod => "prod",
            RedOp::Max => "max",
            RedOp::Min => "min",
            RedOp::Avg => "avg",
            RedOp::PreMulSum { .. } | RedOp::PreMulSumDevice { .. } => "premulsum",
        }
    }
}

/// What an operation does.
#[derive(Clone, Copy, Debug)]
pub(crate) enum OpKind {
    /// A collective with its root (0 when rootless) and reduction op.
    Coll {
        kind: CollKind,
        root: usize,
        op: RedOp,
    },
    /// A point-to-point send to `peer`.
    Send { peer: usize },
    /// A point-to-point receive from `peer`.
    Recv { peer: usize },
}

/// A call's arguments, already validated: what it does and on which raw
/// buffers.
#[derive(Clone, Copy)]
pub(crate) struct OpArgs {
    pub kind: OpKind,
    pub send: *const u8,
    pub recv: *mut u8,
    pub count: usize,
    pub dtype: DataType,
}

/// Which executor runs a launch: decided once, where the launch is
/// enqueued (`crate::launch` for host memory,
/// `crate::device_executor::stream` for device memory), recorded on each
/// communicator's share of the launch and read from then on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Executor {
    /// The host executor, on host memory.
    Host,
    /// The host executor over host copies of device memory
    /// (`device_executor/host_staging.rs`), on connections of its own.
    HostOverStaging,
    /// Device work (`crate::device_executor`).
    Device,
}
