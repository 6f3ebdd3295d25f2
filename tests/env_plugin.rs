//! The NCCL environment plug-in (`NCCL_ENV_PLUGIN`): a minimal C plug-in
//! (`tests/c/plugins/env.c`), built at v2 and at v1, supplies `NCCL_ALGO`,
//! which the algorithm `all_reduce_perf -J` reports follows. As with
//! NCCL, the plug-in answers every lookup: its value wins over the one the
//! user set in the environment, and a setting it has no value for comes
//! from the environment.

#[path = "common/c_plugins.rs"]
mod c_plugins;
#[path = "common/perf_bins.rs"]
mod perf_bins;

/// The algorithm and protocol of each row of an `all_reduce_perf -J` run
/// of 4 ranks under `env`.
fn choices(tag: &str, env: &[(&str, &str)]) -> Vec<(String, String)> {
    let json = c_plugins::scratch("env-plugin").join(format!("{tag}.json"));
    let (rows, _) = c_plugins::perf_rows(&json, |cmd| {
        cmd.env_remove("NCCL_ENV_PLUGIN").envs(env.iter().copied());
    });
    rows.iter()
        .map(|r| {
            let field = |name: &str| r[name].as_str().unwrap().to_string();
            (field("algorithm"), field("protocol"))
        })
        .collect()
}

#[test]
fn an_env_plugin_answers_every_setting_and_the_environment_fills_its_gaps() {
    let dir = c_plugins::scratch("env-plugin");
    let (v2, v1) = (dir.join("env-v2.so"), dir.join("libnccl-env-testv1.so"));
    c_plugins::build("env.c", None, &v2);
    c_plugins::build("env.c", Some("ENV_V1"), &v1);
    let all = |algorithm: &str, rows: &[(String, String)]| rows.iter().all(|(a, _)| a == algorithm);

    let baseline = choices("none", &[("TEST_ENV_ALGO", "tree")]);
    assert!(!all("tree", &baseline), "{baseline:?}");

    // v2 by path supplies NCCL_ALGO=tree.
    let plugin = [
        ("NCCL_ENV_PLUGIN", v2.to_str().unwrap()),
        ("TEST_ENV_ALGO", "tree"),
    ];
    let rows = choices("v2", &plugin);
    assert!(all("tree", &rows), "{rows:?}");

    // The plug-in's value wins over the user's; what it has no value for
    // (NCCL_PROTO) comes from the environment.
    let mut user = plugin.to_vec();
    user.extend([("NCCL_ALGO", "ring"), ("NCCL_PROTO", "LL128")]);
    let rows = choices("user", &user);
    assert!(all("tree", &rows), "{rows:?}");
    assert!(rows.iter().all(|(_, p)| p == "LL128"), "{rows:?}");

    // v1 by name (libnccl-env-testv1.so on the library path).
    let rows = choices(
        "v1",
        &[
            ("NCCL_ENV_PLUGIN", "testv1"),
            ("LD_LIBRARY_PATH", dir.to_str().unwrap()),
            ("TEST_ENV_ALGO", "tree"),
        ],
    );
    assert!(all("tree", &rows), "{rows:?}");
    let _ = std::fs::remove_dir_all(dir);
}
