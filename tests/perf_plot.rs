//! `perf_plot` turns -J files into a PNG of busbw against size.
#![cfg(feature = "plot")]

use std::process::Command;

fn json_run(bin: &str, path: &std::path::Path, extra: &[&str]) {
    let mut cmd = Command::new(bin);
    cmd.args(["-g", "2", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-J"])
        .arg(path)
        .args(extra);
    for v in [
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ] {
        cmd.env_remove(v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR");
    let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    (w, h)
}

#[test]
fn two_runs_make_one_png() {
    let dir = std::env::temp_dir().join(format!("rccl-perf-plot-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let a = dir.join("a.json");
    let b = dir.join("b.json");
    json_run(env!("CARGO_BIN_EXE_all_reduce_perf"), &a, &[]);
    json_run(env!("CARGO_BIN_EXE_all_reduce_perf"), &b, &["-d", "double"]);
    let png = dir.join("out.png");
    let out = Command::new(env!("CARGO_BIN_EXE_perf_plot"))
        .args(["-o", png.to_str().unwrap(), "--size", "640x400"])
        .arg(format!("{}=float", a.display()))
        .arg(&b)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(png_size(&bytes), (640, 400));
    assert!(bytes.len() > 2000, "a picture with content");

    // A file that is not a perf JSON file is refused.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{\"version\": 3}").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_perf_plot"))
        .args(["-o", png.to_str().unwrap()])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no results list"));
    let _ = std::fs::remove_dir_all(&dir);
}
