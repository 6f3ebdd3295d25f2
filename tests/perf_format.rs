//! Runs the perf binaries with small sizes and checks their output against
//! nccl-tests' format, their bandwidth arithmetic, and the data checker.

use std::process::{Command, Output};

const SMALL: &[&str] = &[
    "-b", "8", "-e", "64K", "-f", "4", "-g", "4", "-n", "2", "-w", "1",
];

fn run(bin: &str, args: &[&str], corrupt: bool) -> (Output, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    // Run as threads of one process whatever launcher variables are set.
    for var in [
        "RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
        "NCCL_TESTS_MIN_BW",
        "NCCL_DETERMINISTIC",
    ] {
        cmd.env_remove(var);
    }
    if corrupt {
        cmd.env("RCCL_PERF_CORRUPT", "1");
    } else {
        cmd.env_remove("RCCL_PERF_CORRUPT");
    }
    let out = cmd.output().expect("run the perf binary");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

/// One parsed result row.
#[derive(Debug)]
struct Row {
    size: u64,
    count: u64,
    dtype: String,
    op: String,
    root: i64,
    halves: Vec<(f64, f64, f64, Option<u64>)>,
}

/// Checks one field's width and right alignment, returning its text.
fn field<'a>(line: &'a str, pos: &mut usize, sep: usize, width: usize) -> &'a str {
    assert!(line.len() >= *pos + sep + width, "row too short: {line:?}");
    assert_eq!(
        &line[*pos..*pos + sep],
        &"  "[..sep],
        "separator in {line:?}"
    );
    let f = &line[*pos + sep..*pos + sep + width];
    *pos += sep + width;
    assert!(!f.trim().is_empty(), "empty field in {line:?}");
    assert!(
        !f.ends_with(' ') || f.trim().is_empty(),
        "field {f:?} not right-aligned in {line:?}"
    );
    f.trim()
}

/// A time or bandwidth as getFloatStr prints it: fixed with 2, 1 or 0
/// decimals, or exponent form.
fn float_field(text: &str) -> f64 {
    let ok = text.parse::<f64>().is_ok()
        && (text.contains('e') || text.split('.').nth(1).is_none_or(|d| d.len() <= 2));
    assert!(ok, "bad number {text:?}");
    text.parse().unwrap()
}

/// Parses a row with nccl-tests' widths:
/// "%12li  %12li  %8s  %6s  %6i" then twice "  %7s  %6s  %6s  %6g".
fn parse_row(line: &str) -> Row {
    let mut pos = 0;
    let size = field(line, &mut pos, 0, 12).parse().expect("size");
    let count = field(line, &mut pos, 2, 12).parse().expect("count");
    let dtype = field(line, &mut pos, 2, 8).to_string();
    let op_text = &line[pos + 2..pos + 8];
    pos += 8;
    let op = op_text.trim().to_string();
    let root = field(line, &mut pos, 2, 6).parse().expect("root");
    let mut halves = Vec::new();
    for _ in 0..2 {
        let t = float_field(field(line, &mut pos, 2, 7));
        let a = float_field(field(line, &mut pos, 2, 6));
        let b = float_field(field(line, &mut pos, 2, 6));
        // nccl-tests prints an unchecked column as "    N/A" (one narrower).
        let wrong = if line[pos..].starts_with("    N/A") {
            pos += 7;
            None
        } else {
            Some(field(line, &mut pos, 2, 6).parse().expect("#wrong"))
        };
        halves.push((t, a, b, wrong));
    }
    assert_eq!(pos, line.len(), "trailing text in {line:?}");
    Row {
        size,
        count,
        dtype,
        op,
        root,
        halves,
    }
}

fn rows(text: &str) -> Vec<Row> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(parse_row)
        .collect()
}

/// busbw / algbw must be the collective's factor, within the rounding of
/// two-decimal printing.
fn assert_factor(row: &Row, factor: f64) {
    for &(_, alg, bus, _) in &row.halves {
        let expect = alg * factor;
        let slack = 0.006 * (1.0 + factor) + expect.abs() * 0.01;
        assert!(
            (bus - expect).abs() <= slack,
            "busbw {bus} vs algbw {alg} * {factor} in {row:?}"
        );
    }
}

#[test]
fn all_reduce_output_matches_nccl_tests_format() {
    let (out, text) = run(env!("CARGO_BIN_EXE_all_reduce_perf"), SMALL, false);
    assert!(
        out.status.success(),
        "exit {:?}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("# rccl-tests version "), "{text}");
    assert!(text.contains("# Collective test starting: all_reduce_perf\n"));
    assert!(text.contains(
        "# nThread 1 nGpus 4 minBytes 8 maxBytes 65536 step: 4(factor) warmup iters: 1 iters: 2 agg iters: 1 validation: 1 graph: 0 unalign: 0\n"
    ));
    assert!(text.contains("# Deterministic: off\n"), "{text}");
    assert!(text.contains("# Using devices\n"));
    let pid = out.status.code().map(|_| ()).and(Some(()));
    assert!(pid.is_some());
    let devices: Vec<_> = lines.iter().filter(|l| l.starts_with("#  Rank ")).collect();
    assert_eq!(devices.len(), 4, "{text}");
    for (i, d) in devices.iter().enumerate() {
        assert!(
            d.starts_with(&format!("#  Rank {i:>2} Group  0 Pid ")),
            "{d}"
        );
        assert!(
            d.contains(&format!(" device {i:>2} [cpu] host memory")),
            "{d}"
        );
    }
    assert!(text.contains(
        "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong \n"
    ));
    assert!(text.contains(
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         \n"
    ));
    let rows = rows(&text);
    let sizes: Vec<u64> = rows.iter().map(|r| r.size).collect();
    assert_eq!(sizes, [8, 32, 128, 512, 2048, 8192, 32768]);
    for r in &rows {
        assert_eq!(r.count, r.size / 4);
        assert_eq!(
            (r.dtype.as_str(), r.op.as_str(), r.root),
            ("float", "sum", -1)
        );
        for h in &r.halves {
            assert_eq!(h.3, Some(0), "{r:?}");
            assert!(h.0 > 0.0);
        }
        assert_factor(r, 2.0 * 3.0 / 4.0);
    }
    assert!(text.contains("# Out of bounds values : 0 OK\n"), "{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("# Avg bus bandwidth    : ")),
        "{text}"
    );
    assert!(text.contains("# Collective test concluded: all_reduce_perf\n"));
}

#[test]
fn corrupted_output_is_counted_and_fails_the_run() {
    let (out, text) = run(env!("CARGO_BIN_EXE_all_reduce_perf"), SMALL, true);
    assert!(
        !out.status.success(),
        "corruption must fail the run\n{text}"
    );
    let rows = rows(&text);
    assert_eq!(rows.len(), 7);
    for r in &rows {
        for h in &r.halves {
            assert_eq!(h.3, Some(1), "exactly the flipped element is wrong: {r:?}");
        }
    }
    assert!(
        text.contains("# Out of bounds values : 14 FAILED\n"),
        "{text}"
    );
}

#[test]
fn no_check_prints_na() {
    let mut args = SMALL.to_vec();
    args.extend(["-c", "0", "-e", "32"]);
    let (out, text) = run(env!("CARGO_BIN_EXE_all_reduce_perf"), &args, false);
    assert!(out.status.success(), "{text}");
    for r in rows(&text) {
        assert!(r.halves.iter().all(|h| h.3.is_none()), "{r:?}");
    }
}

/// Every other collective: sizes, factor and a clean check on 4 ranks.
#[test]
fn every_collective_checks_clean_with_its_bus_factor() {
    let cases: &[(&str, f64, &str)] = &[
        (env!("CARGO_BIN_EXE_all_gather_perf"), 0.75, "none"),
        (env!("CARGO_BIN_EXE_broadcast_perf"), 1.0, "none"),
        (env!("CARGO_BIN_EXE_reduce_perf"), 1.0, "sum"),
        (env!("CARGO_BIN_EXE_reduce_scatter_perf"), 0.75, "sum"),
        (env!("CARGO_BIN_EXE_alltoall_perf"), 0.75, "none"),
        (env!("CARGO_BIN_EXE_gather_perf"), 0.75, "none"),
        (env!("CARGO_BIN_EXE_scatter_perf"), 0.75, "none"),
        (env!("CARGO_BIN_EXE_sendrecv_perf"), 1.0, "sum"),
        (env!("CARGO_BIN_EXE_hypercube_perf"), 1.0, ""),
    ];
    for &(bin, factor, op) in cases {
        let (out, text) = run(
            bin,
            &[
                "-b", "64", "-e", "16K", "-f", "4", "-g", "4", "-n", "2", "-w", "1",
            ],
            false,
        );
        assert!(
            out.status.success(),
            "{bin}: exit {:?}\n{text}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = rows(&text);
        assert_eq!(rows.len(), 5, "{bin}\n{text}");
        for r in &rows {
            assert_eq!(r.op, op, "{bin}");
            assert_eq!(r.halves[0].3, Some(0), "{bin}: {r:?}");
            if bin.ends_with("sendrecv_perf") || bin.ends_with("alltoall_perf") {
                assert_eq!(r.halves[1].3, None, "{bin}: in place is not checked");
            } else {
                assert_eq!(r.halves[1].3, Some(0), "{bin}: {r:?}");
            }
            assert_factor(r, factor);
        }
        assert!(
            text.contains("# Out of bounds values : 0 OK\n"),
            "{bin}\n{text}"
        );
    }
}

/// Every datatype and operator of all_reduce checks clean (the data is
/// exact for each type).
#[test]
fn all_reduce_every_type_and_op() {
    let (out, text) = run(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &[
            "-b", "1K", "-e", "1K", "-g", "3", "-n", "1", "-w", "0", "-d", "all", "-o", "all",
        ],
        false,
    );
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = rows(&text);
    assert_eq!(rows.len(), 12 * 6, "{text}");
    for r in &rows {
        assert!(r.halves.iter().all(|h| h.3 == Some(0)), "{r:?}");
    }
}
