//! `reduce_scatter_perf`: nccl-tests' reduce_scatter_perf over rccl-rs.

fn main() -> std::process::ExitCode {
    rccl_tests::perf::main(rccl_tests::perf::Coll::ReduceScatter)
}
