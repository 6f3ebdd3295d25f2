//! NVIDIA's NCCL headers, where `RCCLRS_NVIDIA_NCCL_INCLUDE` names their
//! folders (colon-separated: nccl's and CUDA's, as `.ci/run` downloads
//! them), for the tests that compare librcclrs with NVIDIA's NCCL.

use std::path::PathBuf;

/// The folders `RCCLRS_NVIDIA_NCCL_INCLUDE` names, if it is set.
pub fn include_dirs() -> Option<Vec<PathBuf>> {
    let dirs = std::env::var_os("RCCLRS_NVIDIA_NCCL_INCLUDE")?;
    Some(std::env::split_paths(&dirs).collect())
}

/// NVIDIA's nccl.h: in the first of `dirs` that holds one.
pub fn nccl_h(dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join("nccl.h"))
        .find(|header| header.exists())
}

/// What a header's text `#define`s `name` as.
pub fn define<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header.lines().find_map(|line| {
        let mut words = line.strip_prefix("#define ")?.split_whitespace();
        (words.next()? == name).then(|| words.next()).flatten()
    })
}
