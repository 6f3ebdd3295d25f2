//! The committed fatbin is the build of the committed sources: every
//! kernel source and the fatbin match the hashes scripts/build-kernels.sh
//! wrote into fatbin/MANIFEST, and every source is listed. No CUDA
//! compiler is needed to check it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sha256_hex(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `(kind, fields)` of each manifest line, comments left out.
fn manifest() -> Vec<(String, Vec<String>)> {
    rccl_device::KERNELS_MANIFEST
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut words = l.split_whitespace().map(str::to_string);
            let kind = words.next().unwrap_or_default();
            (kind, words.collect())
        })
        .collect()
}

/// The manifest's path (relative to the repository root) as a path here.
fn repo_path(rel: &str) -> PathBuf {
    crate_dir().join("..").join(rel)
}

#[test]
fn every_kernel_source_matches_the_manifest() {
    let mut listed = BTreeSet::new();
    for (kind, fields) in manifest() {
        if kind != "source" {
            continue;
        }
        let [path, hash] = &fields[..] else {
            panic!("malformed source line: {fields:?}");
        };
        assert_eq!(
            &sha256_hex(&repo_path(path)),
            hash,
            "{path} changed since the fatbin was built: run scripts/build-kernels.sh"
        );
        listed.insert(path.clone());
    }
    let on_disk: BTreeSet<String> = std::fs::read_dir(crate_dir().join("kernels"))
        .expect("kernels/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".cu") || name.ends_with(".h"))
        .map(|name| format!("device/kernels/{name}"))
        .collect();
    assert_eq!(
        listed, on_disk,
        "kernel sources and the manifest disagree: run scripts/build-kernels.sh"
    );
}

#[test]
fn the_fatbin_is_the_one_the_manifest_names() {
    let lines = manifest();
    let fatbin = lines
        .iter()
        .find(|(kind, _)| kind == "fatbin")
        .map(|(_, f)| f.clone())
        .expect("a fatbin line");
    let [path, hash, size] = &fatbin[..] else {
        panic!("malformed fatbin line: {fatbin:?}");
    };
    assert_eq!(
        &sha256_hex(&repo_path(path)),
        hash,
        "{path} is not the fatbin built"
    );
    assert_eq!(
        rccl_device::KERNELS_FATBIN.len().to_string(),
        *size,
        "the embedded fatbin"
    );
    let embedded: String = Sha256::digest(rccl_device::KERNELS_FATBIN)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(&embedded, hash, "the embedded fatbin");
}

#[test]
fn the_fatbin_was_built_by_nvcc_13_0_for_every_target() {
    let lines = manifest();
    let field = |kind: &str| {
        lines
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, f)| f.join(" "))
            .unwrap_or_else(|| panic!("no {kind} line"))
    };
    // A newer compiler emits PTX the CUDA 13.0 drivers refuse.
    assert!(field("nvcc").starts_with("V13.0."), "{}", field("nvcc"));
    let flags = field("flags");
    for target in [
        "code=sm_80",
        "code=sm_90",
        "code=sm_100",
        "code=compute_80",
        "-fmad=false",
    ] {
        assert!(flags.contains(target), "{target} missing from {flags}");
    }
}
