//! librcclrs.so exports exactly the `nccl*`/`pnccl*` functions NVIDIA's
//! libnccl.so.2 2.32 exports: a program linked against NVIDIA's library
//! loads against ours. Compared with the dynamic symbols of NVIDIA's
//! library when `RCCLRS_NVIDIA_NCCL_INCLUDE` leads to it (`.ci/run`
//! downloads it beside the headers, in `nccl/lib`), else with the list
//! committed beside this test (taken from NVIDIA's 2.32.6 library).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

mod nvidia;

/// librcclrs.so of this build (cargo builds the cdylib with the rlib).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [
        deps.join("librcclrs.so"),
        deps.parent().unwrap().join("librcclrs.so"),
    ]
    .into_iter()
    .find(|p| p.exists())
    .expect("librcclrs.so next to the test binary")
}

/// The defined dynamic `nccl*`/`pnccl*` function names of `library`.
fn nccl_exports(library: &Path) -> BTreeSet<String> {
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(library)
        .output()
        .expect("running nm (binutils)");
    assert!(out.status.success(), "nm {}: {out:?}", library.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (kind, name) = (fields.nth(1)?, fields.next()?);
            let function = kind == "T" || kind == "W" || kind == "i";
            let nccl = name.starts_with("nccl") || name.starts_with("pnccl");
            (function && nccl).then(|| name.to_string())
        })
        .collect()
}

/// NVIDIA's libnccl.so.2 next to the include folders the CI names, and
/// its `major.minor` from the nccl.h beside it.
fn nvidia_library() -> Option<(PathBuf, String)> {
    let header = nvidia::nccl_h(&nvidia::include_dirs()?)?;
    let lib = header.parent()?.join("../lib/libnccl.so.2");
    let text = std::fs::read_to_string(&header).ok()?;
    let define = |name| nvidia::define(&text, name);
    let version = format!("{}.{}", define("NCCL_MAJOR")?, define("NCCL_MINOR")?);
    lib.exists().then_some((lib, version))
}

fn committed() -> BTreeSet<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nccl-2.32.6-exports.txt");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

fn assert_same(ours: &BTreeSet<String>, theirs: &BTreeSet<String>, what: &str) {
    let missing: Vec<_> = theirs.difference(ours).collect();
    let extra: Vec<_> = ours.difference(theirs).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "librcclrs.so against {what}: missing {missing:?}, not in NCCL {extra:?}"
    );
}

#[test]
fn exports_equal_nvidia_libnccl() {
    let ours = nccl_exports(&cdylib());
    let list = committed();
    assert_eq!(list.len(), 193, "the committed list is NCCL 2.32.6's");
    assert_same(&ours, &list, "the committed list of NCCL 2.32.6");
    match nvidia_library() {
        Some((lib, version)) if version == "2.32" => {
            let theirs = nccl_exports(&lib);
            assert_same(&ours, &theirs, &lib.display().to_string());
            eprintln!("compared with {} ({} names)", lib.display(), theirs.len());
        }
        // A newer NCCL is a new target, not a regression: say what it adds.
        Some((lib, version)) => eprintln!(
            "NVIDIA's library is NCCL {version}, this library implements 2.32; \
             {} exports names librcclrs.so lacks: {:?}",
            lib.display(),
            nccl_exports(&lib).difference(&ours).collect::<Vec<_>>()
        ),
        None => eprintln!(
            "NVIDIA's libnccl.so.2 not found (RCCLRS_NVIDIA_NCCL_INCLUDE unset): \
             compared with the committed list only"
        ),
    }
}
