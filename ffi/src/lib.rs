//! The nccl.h-compatible C ABI.
