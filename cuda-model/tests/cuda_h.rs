//! A C program built against CUDA's own `cuda.h` and linked with
//! `-lcuda` runs on the model.

#[macro_use]
mod common;

use std::process::Command;

use common::model_library;

/// Where CUDA's `cuda.h` is: `RCCL_CUDA_INCLUDE`, else where `.ci/run`
/// downloads it (the `nvidia-cuda-runtime` wheel).
fn cuda_include() -> Option<std::path::PathBuf> {
    let downloaded = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/nvidia-nccl/x/nvidia/cu13/include");
    std::env::var_os("RCCL_CUDA_INCLUDE")
        .map(Into::into)
        .into_iter()
        .chain([downloaded])
        .find(|d| d.join("cuda.h").exists())
}

#[test]
fn a_c_program_built_against_cuda_h_runs_on_the_model() {
    let Some(include) = cuda_include() else {
        eprintln!("skipped: no cuda.h (set RCCL_CUDA_INCLUDE, or run .ci/run, which downloads it)");
        return;
    };
    let folder = model_library()
        .parent()
        .unwrap()
        .join(format!("cuda-h-{}", std::process::id()));
    std::fs::create_dir_all(&folder).unwrap();
    for name in ["libcuda.so", "libcuda.so.1"] {
        let _ = std::fs::remove_file(folder.join(name));
        std::os::unix::fs::symlink(model_library(), folder.join(name)).unwrap();
    }
    let program = folder.join("driver_api");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/driver_api.c");
    let built = Command::new("cc")
        .args(["-std=c99", "-Wall", "-Werror", "-I"])
        .arg(&include)
        .arg(&source)
        .arg("-L")
        .arg(&folder)
        .args(["-lcuda", "-o"])
        .arg(&program)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let run = Command::new(&program)
        .env("LD_LIBRARY_PATH", &folder)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&folder);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}
