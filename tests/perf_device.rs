//! The perf binaries on device memory of the emulated GPU
//! (`RCCL_DEVICE=emu`): every binary with `--memory device -g 4 -c 1`
//! checks clean and names the memory and device in its header; a
//! corrupted output is counted (the checker reads the device buffers).

#[path = "common/perf_bins.rs"]
mod perf_bins;
use perf_bins::{perf_command, BINS};

fn run_on_emu(bin: &str, args: &[&str], corrupt: bool) -> (bool, String) {
    let mut cmd = perf_command(bin, args);
    cmd.env("RCCL_DEVICE", "emu")
        .env("RCCL_TIMEOUT_MS", "60000");
    if corrupt {
        cmd.env("RCCL_PERF_CORRUPT", "1");
    }
    let out = cmd.output().expect("run the perf binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

const SMALL: &[&str] = &[
    "--memory", "device", "-g", "4", "-c", "1", "-b", "8", "-e", "64K", "-f", "8", "-n", "2", "-w",
    "1",
];

#[test]
fn every_binary_checks_clean_on_emu_device_memory() {
    for (name, bin) in BINS {
        let (ok, text) = run_on_emu(bin, SMALL, false);
        assert!(ok, "{name} failed:\n{text}");
        assert!(
            text.contains("memory=device [emu 0]") && text.contains("[emu 0] device memory"),
            "{name}: the header names no device:\n{text}"
        );
        assert!(
            text.contains("# Out of bounds values : 0 OK"),
            "{name}:\n{text}"
        );
    }
}

#[test]
fn every_binary_with_four_processes_checks_clean_through_p2p_ipc() {
    let args = [
        "--memory", "device", "--procs", "4", "-c", "1", "-b", "8", "-e", "64K", "-f", "8192",
        "-n", "1", "-w", "0",
    ];
    for (name, bin) in BINS {
        let mut cmd = perf_command(bin, &args);
        cmd.env("RCCL_DEVICE", "emu")
            .env("RCCL_TIMEOUT_MS", "60000")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "P2P");
        let out = cmd.output().expect("run the perf binary");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{name} failed:\n{text}");
        assert!(
            text.contains("# Out of bounds values : 0 OK"),
            "{name}:\n{text}"
        );
        // 64 KiB is past the board of a small all-reduce: every binary
        // connects some peers, as device work over exported memory.
        assert!(
            text.contains("via P2P/IPC (device work)"),
            "{name}:\n{text}"
        );
    }
}

/// NCCL prints a connection line under INIT and its transport's
/// subsystem: P2P/IPC lines show with `INIT,P2P` (or either alone), not
/// with `SHM`.
#[test]
fn p2p_ipc_connection_lines_print_under_init_and_p2p() {
    let args = [
        "--memory", "device", "--procs", "2", "-c", "1", "-b", "64K", "-e", "64K", "-n", "1", "-w",
        "0",
    ];
    for (subsys, shown) in [
        ("INIT,P2P", true),
        ("INIT", true),
        ("P2P", true),
        ("SHM", false),
    ] {
        let mut cmd = perf_command(BINS[0].1, &args);
        cmd.env("RCCL_DEVICE", "emu")
            .env("RCCL_TIMEOUT_MS", "60000")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", subsys);
        let out = cmd.output().expect("run all_reduce_perf");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "NCCL_DEBUG_SUBSYS={subsys}:\n{text}");
        let lines = text
            .lines()
            .filter(|l| l.contains("NCCL INFO") && l.contains("via P2P/IPC (device work)"))
            .count();
        assert_eq!(lines > 0, shown, "NCCL_DEBUG_SUBSYS={subsys}:\n{text}");
    }
}

#[test]
fn every_type_and_op_checks_clean_on_emu_device_memory() {
    let mut args = SMALL.to_vec();
    args.extend(["-d", "all", "-o", "all", "-e", "4K"]);
    for name in ["all_reduce_perf", "reduce_scatter_perf"] {
        let bin = BINS.iter().find(|(n, _)| *n == name).unwrap().1;
        let (ok, text) = run_on_emu(bin, &args, false);
        assert!(ok, "{name} failed:\n{text}");
        assert!(text.contains("# Out of bounds values : 0 OK"), "{text}");
    }
}

#[test]
fn a_corrupted_device_output_is_counted() {
    let bin = BINS
        .iter()
        .find(|(n, _)| *n == "all_reduce_perf")
        .unwrap()
        .1;
    let (ok, text) = run_on_emu(bin, SMALL, true);
    assert!(!ok, "a wrong element passed:\n{text}");
    assert!(text.contains("FAILED"), "{text}");
}

#[test]
fn device_memory_without_a_device_backend_is_refused() {
    let bin = BINS[0].1;
    let out = perf_command(bin, &["--memory", "device", "-b", "8", "-e", "8"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success());
    assert!(
        text.contains("--memory device: no device backend"),
        "{text}"
    );
}
