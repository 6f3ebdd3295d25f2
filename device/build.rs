//! Compiles the host twin of the CUDA kernels: the same sources as the
//! fatbins (device/kernels/), built by the host's C++ compiler so tests can
//! run the data path without a GPU. No CUDA compiler is needed: the fatbins
//! are built by scripts/build-kernels.sh and committed.

fn main() {
    let sources = [
        "port.h", "move.h", "reduce.h", "fifo.h", "work.h", "twin.cpp",
    ];
    for source in sources {
        println!("cargo:rerun-if-changed=kernels/{source}");
    }
    cc::Build::new()
        .cpp(true)
        .file("kernels/twin.cpp")
        .flag("-std=c++17")
        // Each operation rounded on its own, as the kernels (nvcc
        // -fmad=false) and rccl's host kernels compute.
        .flag_if_supported("-ffp-contract=off")
        .flag_if_supported("-fno-fast-math")
        .opt_level(2)
        .warnings(true)
        .compile("rccl_kernels_twin");
}
