//! `sendrecv_perf`: nccl-tests' sendrecv_perf over rccl-rs.

fn main() -> std::process::ExitCode {
    rccl_tests::perf::main(rccl_tests::perf::Coll::SendRecv)
}
