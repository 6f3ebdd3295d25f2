//! NCCL profiler plug-ins (`NCCL_PROFILER_PLUGIN`): a minimal C plug-in
//! (`tests/c/plugins/profiler.c`), built once per interface version v1 to
//! v6, sees every collective of an `all_reduce_perf` run as a collective
//! event inside a group event (from v5 on, with its API event and the
//! group API event), nested and closed as NCCL's contract says, and the
//! sends and receives of a `sendrecv_perf` run, and the collectives of
//! calls on device memory (device work of the emulated GPU), and the proxy
//! operations and steps of collectives between two processes over the
//! Socket network, nested in their collectives; it is found by
//! path, by name (`libnccl-profiler-X.so`) and as `libnccl-profiler.so`;
//! its activation mask is honoured; a library without a profiler table
//! and a plug-in whose init fails are reported and the run goes on
//! without profiler.

use std::collections::HashMap;
use std::path::Path;

#[path = "common/c_plugins.rs"]
mod c_plugins;
#[path = "common/perf_bins.rs"]
mod perf_bins;

/// The run's sizes and iterations: `-b 1K -e 4K -f 2 -n 3 -w 2` (data check
/// once per size and placement, the default).
const ARGS: &[&str] = &[
    "-g", "4", "-b", "1K", "-e", "4K", "-f", "2", "-n", "3", "-w", "2",
];
const RANKS: usize = 4;

/// The calls each rank of a run of [`ARGS`] makes on its communicator, as
/// the harness makes them: `-w` warm-up calls at every size, then per size
/// out of place and in place one untimed call, `-n` timed calls and one
/// checked call.
fn calls_per_rank() -> usize {
    let (sizes, warmup, iters, checks) = (3, 2, 3, 1);
    warmup * sizes + sizes * 2 * (1 + iters + checks)
}

/// What one plug-in context (one communicator) wrote at finalize.
#[derive(Debug)]
struct Summary(HashMap<String, String>);

impl Summary {
    fn read(path: &Path) -> Summary {
        let text = std::fs::read_to_string(path).unwrap();
        Summary(
            text.lines()
                .filter_map(|l| l.split_once(' '))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> &str {
        self.0.get(key).map_or("", String::as_str)
    }

    /// Events of a type started and stopped.
    fn count(&self, key: &str) -> (usize, usize) {
        let (started, stopped) = self.get(key).split_once(' ').expect(key);
        (started.parse().unwrap(), stopped.parse().unwrap())
    }
}

/// Runs `bin` with [`ARGS`] and `extra` under `env`; the summaries the
/// plug-in wrote and the run's output.
fn run(bin: &str, extra: &[&str], tag: &str, env: &[(&str, &str)]) -> (Vec<Summary>, String) {
    run_with(bin, ARGS, extra, tag, env)
}

/// [`run`] with `args` instead of [`ARGS`].
fn run_with(
    bin: &str,
    args: &[&str],
    extra: &[&str],
    tag: &str,
    env: &[(&str, &str)],
) -> (Vec<Summary>, String) {
    // Apart from the tests' own folders, which each removes when done
    // while the others run.
    let dir = c_plugins::scratch("profiler-plugin-runs").join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut cmd = perf_bins::perf_command(bin, args);
    cmd.args(extra);
    cmd.env_remove("NCCL_PROFILER_PLUGIN")
        .env_remove("NCCL_NET_PLUGIN")
        .env("NCCL_DEBUG", "INFO")
        .env("NCCL_DEBUG_SUBSYS", "INIT")
        .env("TEST_PROFILER_DIR", &dir)
        .envs(env.iter().copied());
    let out = cmd.output().expect("running the perf binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{tag}: {text}");
    let summaries = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| Summary::read(&e.unwrap().path()))
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    (summaries, text)
}

/// The contexts of the run's own communicators (the harness's barriers
/// run on others, over doubles), each checked for errors first.
fn measured<'a>(summaries: &'a [Summary], float32: &str) -> Vec<&'a Summary> {
    for s in summaries {
        assert_eq!(s.get("errors"), "0", "{s:?}");
        assert_eq!(s.get("open"), "0", "{s:?}");
    }
    summaries
        .iter()
        .filter(|s| s.get("last_coll").split(' ').nth(1) == Some(float32))
        .collect()
}

fn all_reduce(tag: &str, env: &[(&str, &str)]) -> (Vec<Summary>, String) {
    run(env!("CARGO_BIN_EXE_all_reduce_perf"), &[], tag, env)
}

#[test]
fn every_version_sees_every_collective_nested_in_its_group() {
    let dir = c_plugins::scratch("profiler-plugin");
    let lib_dir = dir.join("lib");
    std::fs::create_dir_all(&lib_dir).unwrap();
    let lib_path = lib_dir.to_str().unwrap().to_string();
    let calls = calls_per_rank();
    for version in 1..=6 {
        // v1 by its name on the library path, v2 as the default library,
        // the others by path.
        let file = match version {
            1 => lib_dir.join("libnccl-profiler-testv1.so"),
            2 => lib_dir.join("libnccl-profiler.so"),
            _ => dir.join(format!("profiler-v{version}.so")),
        };
        c_plugins::build(
            "profiler.c",
            Some(&format!("PROFILER_VERSION={version}")),
            &file,
        );
        let file_env = file.to_str().unwrap().to_string();
        let env: Vec<(&str, &str)> = match version {
            1 => vec![
                ("NCCL_PROFILER_PLUGIN", "testv1"),
                ("LD_LIBRARY_PATH", &lib_path),
            ],
            2 => vec![("LD_LIBRARY_PATH", &lib_path)],
            _ => vec![("NCCL_PROFILER_PLUGIN", &file_env)],
        };
        let (summaries, log) = all_reduce(&format!("v{version}"), &env);
        assert!(
            log.contains(&format!(
                "PROFILER/Plugin: loaded test-profiler-v{version} (ncclProfiler v{version})"
            )),
            "{log}"
        );
        // v1 gives codes: ncclFuncAllReduce 4, ncclFloat32 7.
        let (func, float32) = if version == 1 {
            ("4", "7")
        } else {
            ("AllReduce", "ncclFloat32")
        };
        let ranks = measured(&summaries, float32);
        assert_eq!(ranks.len(), RANKS, "v{version}: {summaries:?}");
        // From v5 on, each call's API event (and, on the context of a
        // group's first call, one group API event per group: the harness
        // drives the 4 ranks from one thread, a group per call).
        let (api_calls, api_groups) = if version >= 5 { (calls, calls) } else { (0, 0) };
        let groups: usize = ranks.iter().map(|s| s.count("group_api").0).sum();
        assert_eq!(groups, api_groups, "v{version}: {ranks:?}");
        for s in ranks {
            assert_eq!(
                s.count("coll_api"),
                (api_calls, api_calls),
                "v{version}: {s:?}"
            );
            let (started, stopped) = s.count("group_api");
            assert_eq!(started, stopped, "v{version}: {s:?}");
            assert_eq!(s.get("version"), version.to_string(), "{s:?}");
            assert_eq!(s.count("coll"), (calls, calls), "v{version}: {s:?}");
            // Each call outside a group is a launch of its own.
            assert_eq!(s.count("group"), (calls, calls), "v{version}: {s:?}");
            assert_eq!(s.count("p2p"), (0, 0), "v{version}: {s:?}");
            assert!(s.get("last_coll").starts_with(func), "{s:?}");
        }
        std::fs::remove_file(&file).unwrap();
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sends_and_receives_are_point_to_point_events_of_their_group() {
    let dir = c_plugins::scratch("profiler-plugin-p2p");
    let file = dir.join("profiler-v6.so");
    c_plugins::build("profiler.c", None, &file);
    let (summaries, _) = run(
        env!("CARGO_BIN_EXE_sendrecv_perf"),
        &[],
        "p2p",
        &[("NCCL_PROFILER_PLUGIN", file.to_str().unwrap())],
    );
    let calls = calls_per_rank();
    // The run's own communicators made no collective; each of their
    // launches is a send and a receive.
    let ranks: Vec<_> = summaries
        .iter()
        .filter(|s| s.count("coll") == (0, 0))
        .collect();
    assert_eq!(ranks.len(), RANKS, "{summaries:?}");
    for s in ranks {
        assert_eq!(s.get("errors"), "0", "{s:?}");
        assert_eq!(s.get("open"), "0", "{s:?}");
        assert_eq!(s.count("group"), (calls, calls), "{s:?}");
        assert_eq!(s.count("p2p"), (2 * calls, 2 * calls), "{s:?}");
        assert_eq!(s.count("p2p_api"), (2 * calls, 2 * calls), "{s:?}");
    }
    let groups: usize = summaries
        .iter()
        .filter(|s| s.count("coll") == (0, 0))
        .map(|s| s.count("group_api").0)
        .sum();
    assert_eq!(groups, calls, "{summaries:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn device_work_reports_the_same_events() {
    let dir = c_plugins::scratch("profiler-plugin-device");
    let file = dir.join("profiler-v6.so");
    c_plugins::build("profiler.c", None, &file);
    // Calls on device memory of the emulated GPU, run as device work.
    let (summaries, log) = run(
        env!("CARGO_BIN_EXE_all_reduce_perf"),
        &["--memory", "device"],
        "device",
        &[
            ("NCCL_PROFILER_PLUGIN", file.to_str().unwrap()),
            ("RCCL_DEVICE", "emu"),
        ],
    );
    assert!(log.contains("Out of bounds values : 0 OK"), "{log}");
    let calls = calls_per_rank();
    let ranks = measured(&summaries, "ncclFloat32");
    assert_eq!(ranks.len(), RANKS, "{summaries:?}");
    for s in ranks {
        assert_eq!(s.count("coll"), (calls, calls), "{s:?}");
        assert_eq!(s.count("group"), (calls, calls), "{s:?}");
        assert_eq!(s.count("coll_api"), (calls, calls), "{s:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_activation_mask_decides_which_events_start() {
    let dir = c_plugins::scratch("profiler-plugin-mask");
    let file = dir.join("profiler-v6.so");
    c_plugins::build("profiler.c", None, &file);
    let path = file.to_str().unwrap();
    // Point-to-point events only: the groups (their parents) start, the
    // collectives do not.
    let (summaries, log) = all_reduce(
        "mask-p2p",
        &[("NCCL_PROFILER_PLUGIN", path), ("TEST_PROFILER_MASK", "4")],
    );
    assert!(log.contains("event mask 0x4"), "{log}");
    assert_eq!(summaries.len(), 2 * RANKS, "{summaries:?}");
    for s in &summaries {
        assert_eq!(s.get("errors"), "0", "{s:?}");
        assert_eq!(s.count("coll"), (0, 0), "{s:?}");
        assert!(s.count("group").0 > 0, "{s:?}");
    }
    // Nothing asked for, nothing started.
    let (summaries, _) = all_reduce(
        "mask-none",
        &[("NCCL_PROFILER_PLUGIN", path), ("TEST_PROFILER_MASK", "0")],
    );
    assert_eq!(summaries.len(), 2 * RANKS, "{summaries:?}");
    for s in &summaries {
        assert_eq!(s.count("group"), (0, 0), "{s:?}");
        assert_eq!(s.count("coll"), (0, 0), "{s:?}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_bad_plugin_is_reported_and_the_run_goes_on_without_it() {
    let dir = c_plugins::scratch("profiler-plugin-bad");
    let (missing, good) = (dir.join("no-table.so"), dir.join("profiler-v6.so"));
    c_plugins::build("profiler.c", Some("PROFILER_SYMBOL_MISSING"), &missing);
    c_plugins::build("profiler.c", None, &good);

    let (summaries, log) = all_reduce(
        "missing",
        &[("NCCL_PROFILER_PLUGIN", missing.to_str().unwrap())],
    );
    assert!(summaries.is_empty(), "{summaries:?}");
    assert!(
        log.contains("PROFILER/Plugin: not loaded (")
            && log.contains("no-table.so exports none of ncclProfiler_v6 .. ncclProfiler_v1")
            && log.contains("continuing without profiler"),
        "{log}"
    );
    assert!(log.contains("Out of bounds values : 0 OK"), "{log}");

    let (summaries, log) = all_reduce(
        "init-fails",
        &[
            ("NCCL_PROFILER_PLUGIN", good.to_str().unwrap()),
            ("TEST_PROFILER_INIT_FAIL", "1"),
        ],
    );
    assert!(summaries.is_empty(), "{summaries:?}");
    assert!(
        log.contains(
            "PROFILER/Plugin test-profiler-v6: init returned 2; continuing without profiler"
        ),
        "{log}"
    );
    assert!(log.contains("Out of bounds values : 0 OK"), "{log}");

    // `none` loads nothing, even where the default library would load.
    std::fs::copy(&good, dir.join("libnccl-profiler.so")).unwrap();
    let (summaries, log) = all_reduce(
        "none",
        &[
            ("NCCL_PROFILER_PLUGIN", "none"),
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
        ],
    );
    assert!(summaries.is_empty(), "{summaries:?}");
    assert!(!log.contains("PROFILER/Plugin"), "{log}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn collectives_over_the_network_report_proxy_operations_and_steps() {
    let dir = c_plugins::scratch("profiler-plugin-proxy");
    // Two processes of one rank each, the network between them.
    let args = [
        "-g", "1", "--procs", "2", "-b", "1K", "-e", "64K", "-f", "8", "-n", "2", "-w", "1",
    ];
    let network = [("NCCL_SHM_DISABLE", "1"), ("NCCL_P2P_DISABLE", "1")];
    let bin = env!("CARGO_BIN_EXE_all_reduce_perf");
    // v1 (byte types, the proxy operation's states of v1 to v3), v4 (its
    // own states) and v6 (64-bit types).
    for version in [1, 4, 6] {
        let file = dir.join(format!("profiler-v{version}.so"));
        c_plugins::build(
            "profiler.c",
            Some(&format!("PROFILER_VERSION={version}")),
            &file,
        );
        let plugin = ("NCCL_PROFILER_PLUGIN", file.to_str().unwrap());
        // Group, collective, proxy operation and step events.
        let mut env = vec![plugin, ("TEST_PROFILER_MASK", "0x1b")];
        env.extend(network);
        let (summaries, log) = run_with(bin, &args, &[], &format!("proxy-v{version}"), &env);
        assert!(log.contains("Using network Socket"), "{log}");
        assert!(log.contains("Out of bounds values : 0 OK"), "{log}");
        // Each process: its own communicator and the harness's.
        assert_eq!(summaries.len(), 4, "v{version}: {summaries:?}");
        for s in &summaries {
            // The plug-in checked the nesting and the states: a step's
            // parent an open proxy operation, an operation's an open
            // collective.
            assert_eq!(s.get("errors"), "0", "v{version}: {s:?}");
            assert_eq!(s.get("open"), "0", "v{version}: {s:?}");
            let (colls, _) = s.count("coll");
            let (ops, ops_stopped) = s.count("proxy_op");
            let (steps, steps_stopped) = s.count("proxy_step");
            assert_eq!((ops, steps), (ops_stopped, steps_stopped), "{s:?}");
            // Both ways in every collective (one channel), a step at least
            // each: pieces that arrive before their call starts here and
            // sends the proxy posts after it ended are reported too. Only
            // the first piece a connection receives may come before the
            // connection's observer is attached.
            let (sends, recvs) = s.get("proxy_dirs").split_once(' ').unwrap();
            let (sends, recvs): (usize, usize) = (sends.parse().unwrap(), recvs.parse().unwrap());
            assert!(
                colls > 0 && sends == colls && (colls - 1..=colls).contains(&recvs),
                "{s:?}"
            );
            assert_eq!(sends + recvs, ops, "{s:?}");
            assert!(steps >= ops, "{s:?}");
        }
        // A mask without proxy events starts none.
        let mut env = vec![plugin, ("TEST_PROFILER_MASK", "0x3")];
        env.extend(network);
        let (summaries, _) = run_with(bin, &args, &[], &format!("no-proxy-v{version}"), &env);
        assert_eq!(summaries.len(), 4, "v{version}: {summaries:?}");
        for s in &summaries {
            assert_eq!(s.get("errors"), "0", "v{version}: {s:?}");
            assert!(s.count("coll").0 > 0, "{s:?}");
            assert_eq!(s.count("proxy_op"), (0, 0), "{s:?}");
            assert_eq!(s.count("proxy_step"), (0, 0), "{s:?}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
