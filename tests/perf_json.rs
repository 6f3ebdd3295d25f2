//! `-J` and `-I 1`: the JSON file follows nccl-tests' layout (file version
//! 3, as its `tools/analyze_perf_json.py` reads it), the per-iteration and
//! per-rank times are present and consistent, and `--stragglers` prints.

#[path = "common/perf_bins.rs"]
mod perf_bins;
use perf_bins::perf_command;

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rccl-perf-json-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(bin: &str, args: &[&str]) -> (Output, String) {
    let mut cmd = perf_command(bin, args);
    let out = cmd.output().expect("run the perf binary");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, text)
}

fn load(path: &PathBuf) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).expect("valid JSON")
}

fn int(v: &Value, key: &str) -> i64 {
    v[key]
        .as_i64()
        .unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

fn float(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v}"))
}

fn string<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string in {v}"))
}

fn bool_string(v: &Value, key: &str) -> bool {
    match string(v, key) {
        "true" => true,
        "false" => false,
        other => panic!("{key} = {other:?}: nccl-tests writes booleans as \"true\"/\"false\""),
    }
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

/// Checks the top level, `config` and the footer objects; returns the
/// results.
fn check_document(doc: &Value, iters: i64, nprocs: usize, nranks: usize) -> Vec<Value> {
    assert_eq!(int(doc, "version"), 3);
    let keys: Vec<&str> = doc
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "version",
            "start_time",
            "args",
            "env",
            "nccl_version",
            "config",
            "results",
            "out_of_bounds",
            "average_bus_bandwidth",
            "errors",
            "end_time"
        ],
        "top-level keys in nccl-tests' order"
    );
    string(doc, "start_time");
    string(doc, "end_time");
    int(doc, "nccl_version");
    for list in ["args", "env"] {
        assert!(doc[list].as_array().unwrap().iter().all(Value::is_string));
    }
    assert!(doc["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .filter(|e| e.starts_with("NCCL_COMM_SECRET="))
        .all(|e| e == "NCCL_COMM_SECRET=<withheld>"));

    let cfg = &doc["config"];
    for k in [
        "nthreads",
        "ngpus",
        "minimum_bytes",
        "maximum_bytes",
        "warmup_iters",
        "iterations",
        "aggregated_iterations",
        "validation",
        "graph",
        "per_iter_skip",
    ] {
        int(cfg, k);
    }
    assert!(cfg.get("step_factor").is_some() != cfg.get("step_bytes").is_some());
    assert_eq!(int(cfg, "iterations"), iters);
    assert!(bool_string(cfg, "per_iter_timing"));
    bool_string(cfg, "blocking_collectives");
    bool_string(cfg, "parallel_init");
    let devices = cfg["devices"].as_array().expect("devices list");
    assert_eq!(devices.len(), nprocs, "one device entry per process");
    for d in devices {
        for k in ["rank", "group", "pid", "device"] {
            int(d, k);
        }
        for k in ["hostname", "device_hex", "device_info"] {
            string(d, k);
        }
    }
    assert_eq!(cfg["rccl"]["ranks"].as_array().unwrap().len(), nranks);

    let oob = &doc["out_of_bounds"];
    assert_eq!(int(oob, "count"), 0);
    assert!(bool_string(oob, "okay"));
    float(&doc["average_bus_bandwidth"], "bandwidth");
    assert_eq!(string(&doc["average_bus_bandwidth"], "okay"), "unchecked");
    assert!(doc["errors"].as_array().unwrap().is_empty());
    doc["results"].as_array().expect("results").clone()
}

/// Checks one `*_per_iter` object; returns its process rows.
fn check_per_iter(p: &Value, iters: usize, skip: usize, nprocs: usize) -> Vec<Vec<f64>> {
    assert_eq!(int(p, "skipped_iterations") as usize, skip);
    let times = floats(&p["times_us"]);
    assert_eq!(times.len(), iters);
    let summary = &times[skip..];
    let min = summary.iter().copied().fold(f64::MAX, f64::min);
    let max = summary.iter().copied().fold(0.0, f64::max);
    let avg = summary.iter().sum::<f64>() / summary.len() as f64;
    assert!((float(p, "min_us") - min).abs() < 1e-6, "{p}");
    assert!((float(p, "max_us") - max).abs() < 1e-6, "{p}");
    assert!(
        (float(p, "avg_us") - avg).abs() < 1e-6 * avg.max(1.0),
        "{p}"
    );
    for k in ["p50_us", "p95_us", "p99_us"] {
        let v = float(p, k);
        assert!(v >= min && v <= max, "{k} {v} outside [{min}, {max}]");
    }
    assert!(float(p, "stdev_us") >= 0.0);
    float(p, "cv_pct");
    if nprocs > 1 {
        let rows: Vec<Vec<f64>> = p["per_process_max_times_us"]
            .as_array()
            .expect("per_process_max_times_us with several processes")
            .iter()
            .map(floats)
            .collect();
        assert_eq!(rows.len(), nprocs);
        // analyze_perf_json.py's consistency check: times_us is the max
        // over the process rows, iteration by iteration.
        for (i, t) in times.iter().enumerate() {
            assert_eq!(rows.iter().map(|r| r.len()).min(), Some(iters));
            let m = rows.iter().map(|r| r[i]).fold(0.0, f64::max);
            assert!((t - m).abs() < 0.001, "iteration {i}: {t} vs {m}");
        }
        rows
    } else {
        assert!(p.get("per_process_max_times_us").is_none());
        Vec::new()
    }
}

fn check_rows(
    results: &[Value],
    sizes: &[i64],
    iters: usize,
    skip: usize,
    nprocs: usize,
    nranks: usize,
) {
    let got: Vec<i64> = results.iter().map(|r| int(r, "size")).collect();
    assert_eq!(got, sizes);
    for r in results {
        int(r, "count");
        string(r, "type");
        string(r, "redop");
        assert_eq!(string(r, "root").len(), 6, "root as %6i");
        assert_eq!(int(r, "actual_iterations") as usize, iters);
        string(r, "experiment_name");
        for half in ["out_of_place", "in_place"] {
            let h = &r[half];
            for k in ["time", "alg_bw", "bus_bw", "nwrong"] {
                float(h, k);
            }
            assert_eq!(float(h, "nwrong"), 0.0);
            check_per_iter(&r[format!("{half}_per_iter")], iters, skip, nprocs);
            let extra = &r["rccl"][half];
            let ranks = floats(&extra["rank_time_us"]);
            assert_eq!(ranks.len(), nranks);
            let slow = int(extra, "slowest_rank") as usize;
            let fast = int(extra, "fastest_rank") as usize;
            assert_eq!(ranks[slow], float(extra, "max_rank_time_us"));
            assert_eq!(ranks[fast], float(extra, "min_rank_time_us"));
            assert!(ranks.iter().all(|&t| t >= ranks[fast] && t <= ranks[slow]));
        }
        let extra = &r["rccl"];
        assert!(!string(extra, "algorithm").is_empty());
        assert!(["LL", "LL128", "Simple"].contains(&string(extra, "protocol")));
        assert!(int(extra, "channels") >= 1);
    }
}

#[test]
fn four_processes_write_nccl_tests_json_with_process_rows() {
    let dir = temp_dir("procs");
    let path = dir.join("ar.json");
    let (out, text) = run(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &[
            "--procs",
            "4",
            "-b",
            "8",
            "-e",
            "32K",
            "-f",
            "8",
            "-n",
            "6",
            "-w",
            "1",
            "-I",
            "1",
            "-J",
            path.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("# Writing JSON output to {}\n", path.display())));
    assert!(text.contains("i_min    i_max    i_p99    i_cv%"), "{text}");
    let doc = load(&path);
    let results = check_document(&doc, 6, 4, 4);
    check_rows(&results, &[8, 64, 512, 4096, 32768], 6, 0, 4, 4);
    assert_eq!(doc["config"]["rccl"]["launch"], "env");
    // The process rows name four different processes.
    let pids: std::collections::HashSet<i64> = doc["config"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| int(d, "pid"))
        .collect();
    assert_eq!(pids.len(), 4);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn threads_json_skip_and_no_clobber() {
    let dir = temp_dir("threads");
    let path = dir.join("ag.json");
    std::fs::write(&path, "taken").unwrap();
    let (out, text) = run(
        env!("CARGO_BIN_EXE_all_gather_perf"),
        &[
            "-g",
            "4",
            "-b",
            "1K",
            "-e",
            "4K",
            "-f",
            "4",
            "-n",
            "5",
            "-I",
            "1",
            "-K",
            "2",
            "-J",
            path.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{text}");
    // An existing file is kept; the output goes to NAME.0.
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "taken");
    let path0 = dir.join("ag.json.0");
    assert!(text.contains(&format!("# Writing JSON output to {}\n", path0.display())));
    assert!(text.contains("summary skips first 2 iterations"));
    let doc = load(&path0);
    let results = check_document(&doc, 5, 1, 4);
    check_rows(&results, &[1024, 4096], 5, 2, 1, 4);
    assert_eq!(int(&doc["config"], "per_iter_skip"), 2);
    assert_eq!(doc["config"]["rccl"]["launch"], "threads");
    let _ = std::fs::remove_dir_all(dir);
}

/// Without -I the rows carry no per-iteration objects; a corrupted run
/// records its wrong elements in the rows and the footer; --stragglers in
/// one process only would desynchronize nothing either (covered by the
/// screen test).
#[test]
fn json_without_per_iter_and_with_errors() {
    let dir = temp_dir("plain");
    let path = dir.join("bc.json");
    // Processes: only rank 0 writes the file, every rank gathers times.
    let json = path.to_str().unwrap();
    let mut cmd = perf_command(
        env!("CARGO_BIN_EXE_broadcast_perf"),
        &[
            "--procs", "4", "-b", "4K", "-e", "16K", "-f", "4", "-n", "2", "-J", json,
        ],
    );
    cmd.env("RCCL_PERF_CORRUPT", "1");
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    let doc = load(&path);
    let r = &doc["results"][0];
    assert!(r.get("out_of_place_per_iter").is_none());
    assert!(float(&r["out_of_place"], "nwrong") > 0.0);
    assert!(int(&doc["out_of_bounds"], "count") > 0);
    assert_eq!(string(&doc["out_of_bounds"], "okay"), "false");
    assert_eq!(string(&doc["config"], "per_iter_timing"), "false");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn stragglers_on_screen() {
    let (out, text) = run(
        env!("CARGO_BIN_EXE_reduce_scatter_perf"),
        &[
            "-t",
            "4",
            "-b",
            "1K",
            "-e",
            "16K",
            "-f",
            "4",
            "-n",
            "3",
            "--stragglers",
        ],
    );
    assert!(out.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().collect();
    let mut rows = 0;
    for (i, l) in lines.iter().enumerate() {
        if !l.starts_with('#') && !l.trim().is_empty() {
            rows += 1;
            let next = lines[i + 1];
            assert!(
                next.starts_with("#  stragglers  out-of-place: min "),
                "{next}"
            );
            assert!(next.contains("|  in-place: min "), "{next}");
            for part in next.split("(rank ").skip(1) {
                let r: usize = part.split(')').next().unwrap().parse().unwrap();
                assert!(r < 4);
            }
        }
    }
    assert_eq!(rows, 3);
}

/// -I 1 rows have four more columns per half, in getFloatStr's format.
#[test]
fn per_iter_columns_on_screen() {
    let (out, text) = run(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &["-g", "2", "-b", "64", "-e", "64", "-n", "4", "-I", "1"],
    );
    assert!(out.status.success(), "{text}");
    let row = text
        .lines()
        .find(|l| !l.starts_with('#') && !l.trim().is_empty())
        .unwrap();
    let fields: Vec<&str> = row.split_whitespace().collect();
    // size count type redop root + 2 x (time algbw busbw #wrong + 4).
    assert_eq!(fields.len(), 5 + 2 * 8, "{row}");
    assert_eq!(fields[8], "0");
    assert_eq!(fields[16], "0");
    for f in [9, 10, 11, 12, 17, 18, 19, 20] {
        fields[f].parse::<f64>().unwrap();
    }
    // Widths: "%12li  %12li  %8s  %6s  %6s" then "  %7s  %6s  %6s  %6g"
    // and "  %7s  %7s  %7s  %7s" per half.
    assert_eq!(
        row.len(),
        12 + 2 + 12 + 2 + 8 + 2 + 6 + 2 + 6 + 2 * (33 + 36),
        "{row:?}"
    );
}
