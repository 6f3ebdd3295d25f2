//! `reduce_perf`: nccl-tests' reduce_perf over rccl-rs.

#![deny(unsafe_op_in_unsafe_fn)]

fn main() -> std::process::ExitCode {
    rccl_tests::perf::main(rccl_tests::perf::Coll::Reduce)
}
