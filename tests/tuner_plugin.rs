//! NCCL tuner plug-ins (`NCCL_TUNER_PLUGIN`): a minimal C plug-in
//! (`tests/c/plugins/tuner.c`), built here at v6 and at v2, changes the
//! algorithm, protocol and channel count `all_reduce_perf -J` reports; it
//! is found by path, by name (`libnccl-tuner-X.so`) and inside a net
//! plug-in's library, and its messages reach the log under `TUNING`.

#[path = "common/c_plugins.rs"]
mod c_plugins;
#[path = "common/perf_bins.rs"]
mod perf_bins;

/// `(algorithm, protocol, channels)` of each row of an `all_reduce_perf
/// -J` run of 4 ranks under `env`, and its output.
fn choices(tag: &str, env: &[(&str, &str)]) -> (Vec<(String, String, i64)>, String) {
    let json = c_plugins::scratch("tuner-plugin").join(format!("{tag}.json"));
    let (rows, text) = c_plugins::perf_rows(&json, |cmd| {
        cmd.env_remove("NCCL_TUNER_PLUGIN")
            .env_remove("NCCL_NET_PLUGIN")
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "TUNING")
            // Room for the plug-in's channel counts (the default is 2).
            .env("NCCL_MAX_NCHANNELS", "4")
            .envs(env.iter().copied());
    });
    let rows = rows
        .iter()
        .map(|extra| {
            (
                extra["algorithm"].as_str().unwrap().to_string(),
                extra["protocol"].as_str().unwrap().to_string(),
                extra["channels"].as_i64().unwrap(),
            )
        })
        .collect();
    (rows, text)
}

fn forced(algorithm: &str, channels: i64) -> (String, String, i64) {
    (algorithm.to_string(), "Simple".to_string(), channels)
}

#[test]
fn a_c_tuner_plugin_forces_algorithm_protocol_and_channels() {
    let dir = c_plugins::scratch("tuner-plugin");
    let (v6, v2) = (dir.join("tuner-v6.so"), dir.join("libnccl-tuner-testv2.so"));
    c_plugins::build("tuner.c", None, &v6);
    c_plugins::build("tuner.c", Some("TUNER_V2"), &v2);
    let net_dir = dir.join("net");
    std::fs::create_dir_all(&net_dir).unwrap();
    std::fs::copy(&v6, net_dir.join("libnccl-net.so")).unwrap();

    let (baseline, _) = choices("none", &[]);
    eprintln!("built-in: {baseline:?}");
    assert_eq!(baseline.len(), 3, "{baseline:?}");

    // v6 by path: tree, 3 channels, through the cost table.
    let (rows, log) = choices(
        "v6",
        &[
            ("NCCL_TUNER_PLUGIN", v6.to_str().unwrap()),
            ("TEST_TUNER_ALGO", "tree"),
            ("TEST_TUNER_CHANNELS", "3"),
        ],
    );
    assert!(rows.iter().all(|r| *r == forced("tree", 3)), "{rows:?}");
    assert_ne!(
        baseline, rows,
        "the built-in choice was already the forced one"
    );
    assert!(
        log.contains("TUNER/Plugin: loaded test-tuner-v6 (ncclTuner v6)"),
        "{log}"
    );
    assert!(
        log.contains("test tuner: 4 ranks on 1 nodes, forcing tree with 3 channels"),
        "{log}"
    );
    assert!(
        log.contains("test tuner v6: coll 4, 1024 bytes, ring/Simple cost"),
        "{log}"
    );
    assert!(
        log.contains(
            "tuner plug-in test-tuner-v6: AllReduce 1024 bytes -> tree/Simple, 3 channels"
        ),
        "{log}"
    );

    // v2 by name (libnccl-tuner-testv2.so on the library path): ring, 4.
    let path = dir.to_str().unwrap();
    let (rows, log) = choices(
        "v2",
        &[
            ("NCCL_TUNER_PLUGIN", "testv2"),
            ("LD_LIBRARY_PATH", path),
            ("TEST_TUNER_ALGO", "ring"),
            ("TEST_TUNER_CHANNELS", "4"),
        ],
    );
    assert!(rows.iter().all(|r| *r == forced("ring", 4)), "{rows:?}");
    assert_ne!(
        baseline, rows,
        "the built-in choice was already the forced one"
    );
    assert!(log.contains("loaded test-tuner-v2 (ncclTuner v2)"), "{log}");
    assert!(log.contains("test tuner v2: coll 4, 1024 bytes"), "{log}");

    // Unset: the net plug-in's library (libnccl-net.so) exports a tuner.
    let (rows, log) = choices(
        "net",
        &[
            ("LD_LIBRARY_PATH", net_dir.to_str().unwrap()),
            ("TEST_TUNER_ALGO", "tree"),
            ("TEST_TUNER_CHANNELS", "2"),
        ],
    );
    assert!(rows.iter().all(|r| *r == forced("tree", 2)), "{rows:?}");
    assert!(
        log.contains("loaded test-tuner-v6 (ncclTuner v6) from libnccl-net.so"),
        "{log}"
    );

    // `none` loads nothing: the built-in choice.
    let (rows, _) = choices(
        "off",
        &[
            ("NCCL_TUNER_PLUGIN", "none"),
            ("LD_LIBRARY_PATH", net_dir.to_str().unwrap()),
        ],
    );
    assert_eq!(rows, baseline);
    let _ = std::fs::remove_dir_all(dir);
}
