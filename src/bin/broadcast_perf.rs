//! `broadcast_perf`: nccl-tests' broadcast_perf over rccl-rs.

fn main() -> std::process::ExitCode {
    rccl_tests::perf::main(rccl_tests::perf::Coll::Broadcast)
}
