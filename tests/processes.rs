//! The correctness suite and the deterministic mode's calls with 4
//! separate processes on loopback, each joining through the torchrun
//! environment variables; and what such launches let in: strangers without
//! the key, and other jobs on the same port.

#[path = "common/children.rs"]
mod children;
mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use children::{free_port, spawn_ranks};
use common::{all_cases, check, deterministic, run_on_host, CaseBuffers, TEST_BUFFSIZE};
use rccl::{Bootstrap, CollKind, Communicator, DataType, Error, RedOp, UniqueId};

const CHILD_MARKER: &str = "RCCL_TEST_CHILD";

/// Runs as one rank when started by `four_processes`; does nothing when
/// the test harness runs it directly.
#[test]
fn child_rank() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let comm = Communicator::from_env().expect("init from the environment");
    let cases = all_cases(comm.count(), &CollKind::ALL, &DataType::ALL);
    let failures =
        run_on_host(&comm, &cases, CaseBuffers::new, check).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        failures.is_empty(),
        "{}",
        failures[..failures.len().min(10)].join("\n")
    );
}

/// Runs as one rank of `deterministic_processes`: the deterministic mode's
/// calls on host memory, each checked against the reference.
#[test]
fn deterministic_child_rank() {
    if std::env::var_os(DETERMINISTIC_CHILD).is_none() {
        return;
    }
    let comm = Communicator::from_env().expect("init from the environment");
    let (rank, nranks) = (comm.rank(), comm.count());
    let cases = deterministic::cases(nranks);
    let failures = run_on_host(&comm, &cases, deterministic::buffers, deterministic::check)
        .unwrap_or_else(|e| panic!("{e}"));
    deterministic::assert_expected(rank, cases.len(), &failures);
}

const DETERMINISTIC_CHILD: &str = "RCCL_TEST_DETERMINISTIC_CHILD";

fn run_processes(nranks: usize, shm_disable: bool) {
    run_children(nranks, "child_rank", CHILD_MARKER, |_| {
        let shm = if shm_disable { "1" } else { "0" };
        vec![("NCCL_SHM_DISABLE".into(), shm.into())]
    });
}

/// Runs `nranks` processes of the test `child` on loopback (`marker` set,
/// the suite's settings, then what `more` gives each rank), and asserts
/// that each succeeds within three minutes.
fn run_children(
    nranks: usize,
    child: &str,
    marker: &str,
    more: impl Fn(usize) -> Vec<(String, String)>,
) {
    let suite = [
        ("NCCL_BUFFSIZE", TEST_BUFFSIZE.to_string()),
        ("NCCL_MIN_NCHANNELS", "2".into()),
        ("NCCL_MAX_NCHANNELS", "2".into()),
        ("RCCL_TIMEOUT_MS", "60000".into()),
    ];
    let mut ranks = spawn_ranks(child, nranks, |rank| {
        let mut env: Vec<(String, String)> = vec![(marker.into(), "1".into())];
        env.extend(suite.iter().map(|(k, v)| (k.to_string(), v.clone())));
        env.extend(more(rank));
        env
    });
    let passed = ranks.wait_all(Duration::from_secs(180));
    assert!(passed.iter().all(|&p| p), "ranks that passed: {passed:?}");
}

#[test]
fn four_processes_shm() {
    run_processes(4, false);
}

#[test]
fn four_processes_tcp() {
    run_processes(4, true);
}

/// The deterministic mode across 4 processes: every output is the
/// reference's bits over shared memory, over TCP sockets, over the IB
/// model, and with ranks on two hosts (`NCCL_HOSTID`) one after the other
/// or interleaved, each under another algorithm, protocol and channel
/// count asked for; without the mode the tree's outputs are not.
#[test]
fn deterministic_processes() {
    // (NCCL_DETERMINISTIC, the other settings, each rank's host)
    type Run = (
        &'static str,
        &'static [(&'static str, &'static str)],
        fn(usize) -> usize,
    );
    let runs: [Run; 5] = [
        ("1", &[("NCCL_ALGO", "ring")], |_| 0),
        (
            "1",
            &[
                ("NCCL_ALGO", "tree"),
                ("NCCL_PROTO", "LL"),
                ("NCCL_SHM_DISABLE", "1"),
            ],
            |_| 0,
        ),
        (
            "1",
            &[("NCCL_ALGO", "rhd"), ("NCCL_NET", "Socket")],
            |rank| rank % 2,
        ),
        (
            "1",
            &[
                ("NCCL_ALGO", "tree"),
                ("NCCL_NET", "IB"),
                ("RCCL_IB_MODEL", "1"),
                ("NCCL_MAX_NCHANNELS", "3"),
                ("NCCL_MIN_NCHANNELS", "3"),
            ],
            |rank| rank / 2,
        ),
        (
            "0",
            &[("NCCL_ALGO", "allreduce:tree"), ("NCCL_SHM_DISABLE", "1")],
            |_| 0,
        ),
    ];
    for (mode, env, host) in runs {
        let expect = if mode == "1" { "reference" } else { "other" };
        run_children(4, "deterministic_child_rank", DETERMINISTIC_CHILD, |rank| {
            let mut vars = vec![
                ("NCCL_DETERMINISTIC".into(), mode.into()),
                (deterministic::EXPECT.into(), expect.into()),
                ("NCCL_HOSTID".into(), format!("host-{}", host(rank))),
            ];
            vars.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
            vars
        });
    }
}

/// Names a launch role for `child_role`.
const ROLE: &str = "RCCL_TEST_ROLE";

/// Runs one launched role when started by the tests below: `allreduce`
/// joins from the environment and checks one all-reduce; `stranger` tries
/// to register at the job's root without its key, once with a key of its
/// own and once with the address-derived secret alone, and expects both
/// refused; `intruder` (another user, no home directory) expects to get
/// no id without a key, and a refusal with the address-derived secret.
#[test]
fn child_role() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    match role.as_str() {
        "allreduce" => {
            let comm = Communicator::from_env().unwrap_or_else(|e| panic!("init: {e}"));
            let (rank, n) = (comm.rank(), comm.count());
            let send = vec![(rank + 1) as f32; 1024];
            let mut recv = vec![0f32; 1024];
            comm.all_reduce(&send, &mut recv, RedOp::Sum)
                .unwrap_or_else(|e| panic!("all-reduce: {e}"));
            let want = (n * (n + 1) / 2) as f32;
            assert!(
                recv.iter().all(|&v| v == want),
                "rank {rank}: {:?}",
                &recv[..4]
            );
        }
        "stranger" => {
            let env = |v: &str| std::env::var(v).unwrap();
            let addr = format!("{}:{}", env("MASTER_ADDR"), env("MASTER_PORT"));
            let try_join = |what: &str| {
                let id = UniqueId::from_address(&addr).unwrap();
                let abort = Arc::new(AtomicBool::new(false));
                let e = Bootstrap::init(&id, 1, 2, Duration::from_secs(5), abort).expect_err(what);
                assert!(
                    matches!(&e, Error::InvalidUsage(m) if m.contains("refused this rank's secret")),
                    "{what}: {e}"
                );
            };
            try_join("a stranger with a key of its own joined");
            std::env::set_var("RCCL_INSECURE_ADDRESS_SECRET", "1");
            try_join("a stranger with the address-derived secret joined");
        }
        "intruder" => {
            let env = |v: &str| std::env::var(v).unwrap();
            let addr = format!("{}:{}", env("MASTER_ADDR"), env("MASTER_PORT"));
            let e = UniqueId::from_address(&addr).expect_err("an id without a key");
            assert!(e.to_string().contains("HOME is not set"), "{e}");
            std::env::set_var("RCCL_INSECURE_ADDRESS_SECRET", "1");
            let id = UniqueId::from_address(&addr).unwrap();
            let abort = Arc::new(AtomicBool::new(false));
            let e = Bootstrap::init(&id, 1, 2, Duration::from_secs(5), abort)
                .expect_err("another user with the address-derived secret joined");
            assert!(
                matches!(&e, Error::InvalidUsage(m) if m.contains("refused this rank's secret")),
                "{e}"
            );
        }
        other => panic!("unknown role {other}"),
    }
}

/// A home directory of its own for the ranks of one test.
fn scratch_home(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "launch-{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts `role` as rank `rank` of `nranks` with torchrun's variables,
/// `home` as its home directory and `extra` variables; nothing else of
/// this environment names a job or a secret.
fn role_child(
    role: &str,
    ranks: (usize, usize),
    port: u16,
    home: &Path,
    extra: &[(&str, &str)],
) -> Child {
    role_command(role, ranks, port, home, extra)
        .spawn()
        .unwrap()
}

/// The command [`role_child`] starts.
fn role_command(
    role: &str,
    (rank, nranks): (usize, usize),
    port: u16,
    home: &Path,
    extra: &[(&str, &str)],
) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_role",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    for var in [
        "TORCHELASTIC_RUN_ID",
        "TORCHELASTIC_USE_AGENT_STORE",
        "PMIX_NAMESPACE",
        "OMPI_MCA_ess_base_jobid",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "NCCL_COMM_ID",
        "NCCL_COMM_SECRET",
        "RCCL_COMM_SECRET",
        "RCCL_KEY_FILE",
        "RCCL_INSECURE_ADDRESS_SECRET",
    ] {
        cmd.env_remove(var);
    }
    cmd.env(ROLE, role)
        .env("HOME", home)
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", nranks.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env("RCCL_TIMEOUT_MS", "20000")
        .envs(extra.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

/// Waits for `children` (killing any still running after 60 s); returns
/// whether each succeeded, with its standard error.
fn finish(children: Vec<Child>) -> Vec<(bool, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    children
        .into_iter()
        .map(|mut child| {
            while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
        .collect()
}

/// Waits until rank 0 serves the rendezvous on `port`.
fn wait_for_root(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "no root on port {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_stranger_without_the_key_gets_no_place_in_the_job_and_no_data() {
    let port = free_port();
    let home = scratch_home("job");
    let rank0 = role_child("allreduce", (0, 2), port, &home, &[]);
    wait_for_root(port);
    let stranger = role_child("stranger", (1, 2), port, &scratch_home("stranger"), &[]);
    let [(ok, stderr)] = <[_; 1]>::try_from(finish(vec![stranger])).unwrap();
    assert!(ok, "{stderr}");
    let rank1 = role_child("allreduce", (1, 2), port, &home, &[]);
    for (ok, stderr) in finish(vec![rank0, rank1]) {
        assert!(ok, "{stderr}");
    }
    let key = home.join(".rccl").join("key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    std::fs::remove_dir_all(&home).unwrap();
}

/// What the key directory of a victim's home may be found in.
#[derive(Clone, Copy, Debug, PartialEq)]
enum KeyState {
    Missing,
    DanglingSymlink,
    OpenDirectory,
    Fifo,
}

impl KeyState {
    /// Leaves `home`'s `.rccl` in this state; returns what the victim's
    /// refusal must name, if it must refuse.
    fn prepare(self, home: &Path) -> Option<String> {
        let dir = home.join(".rccl");
        let key = dir.join("key");
        if self != KeyState::Missing {
            std::fs::create_dir(&dir).unwrap();
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        match self {
            KeyState::Missing => return None,
            KeyState::DanglingSymlink => {
                std::os::unix::fs::symlink(home.join("nowhere"), &key).unwrap()
            }
            KeyState::OpenDirectory => {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
                return Some(format!("key directory {}", dir.display()));
            }
            KeyState::Fifo => {
                let c_key = std::ffi::CString::new(key.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c_key.as_ptr(), 0o600) }, 0);
            }
        }
        Some(format!("key file {}", key.display()))
    }
}

#[test]
fn another_user_cannot_join_whatever_the_state_of_the_key_directory() {
    for state in [
        KeyState::Missing,
        KeyState::DanglingSymlink,
        KeyState::OpenDirectory,
        KeyState::Fifo,
    ] {
        let port = free_port();
        let home = scratch_home("victim");
        let refusal = state.prepare(&home);
        let mut rank0 = role_child("allreduce", (0, 2), port, &home, &[]);
        // Rank 0 serves the job's root, or refuses to start.
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if rank0.try_wait().unwrap().is_some() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{state:?}: rank 0 neither serves nor refuses"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Some(named) = refusal {
            let [(ok, stderr)] = <[_; 1]>::try_from(finish(vec![rank0])).unwrap();
            assert!(
                !ok && stderr.contains("refusing to derive the secret") && stderr.contains(&named),
                "{state:?}: rank 0 did not refuse naming the {named}: {stderr}"
            );
        } else {
            let intruder = role_command("intruder", (1, 2), port, &home, &[])
                .env_remove("HOME")
                .env("NCCL_DEBUG", "WARN")
                .uid(65534)
                .gid(65534)
                .spawn()
                .expect("starting a child as uid 65534 (the test runs as root)");
            let [(ok, stderr)] = <[_; 1]>::try_from(finish(vec![intruder])).unwrap();
            assert!(ok, "{state:?}: {stderr}");
            assert!(
                stderr.contains("NCCL WARN RCCL_INSECURE_ADDRESS_SECRET=1: the communicator at"),
                "{state:?}: no warning: {stderr}"
            );
            let rank1 = role_child("allreduce", (1, 2), port, &home, &[]);
            for (ok, stderr) in finish(vec![rank0, rank1]) {
                assert!(ok, "{state:?}: {stderr}");
            }
        }
        std::fs::remove_dir_all(&home).unwrap();
    }
}

#[test]
fn two_jobs_named_by_their_launcher_on_one_port_do_not_mix() {
    let port = free_port();
    let home = scratch_home("named");
    let (job_a, job_b) = (
        [("TORCHELASTIC_RUN_ID", "job-a")],
        [("TORCHELASTIC_RUN_ID", "job-b")],
    );
    let a0 = role_child("allreduce", (0, 2), port, &home, &job_a);
    wait_for_root(port);
    // Job b's rank 0 finds the port taken; its rank 1 is refused by job
    // a's root instead of taking job a's rank 1's place.
    let b0 = role_child("allreduce", (0, 2), port, &home, &job_b);
    let b1 = role_child("allreduce", (1, 2), port, &home, &job_b);
    let b = finish(vec![b0, b1]);
    assert!(
        !b[0].0
            && b[0]
                .1
                .contains("another job or program is using this address"),
        "{}",
        b[0].1
    );
    assert!(
        !b[1].0 && b[1].1.contains("refused this rank's secret"),
        "{}",
        b[1].1
    );
    let a1 = role_child("allreduce", (1, 2), port, &home, &job_a);
    for (ok, stderr) in finish(vec![a0, a1]) {
        assert!(ok, "{stderr}");
    }
    std::fs::remove_dir_all(&home).unwrap();
}

/// Two 3-rank jobs the launcher does not name, on one port: both rank 1s
/// register at job a's root. Every registrant fails at once, told both
/// rank 1s' pids; job b's rank 0 finds the port taken.
#[test]
fn without_a_job_name_a_rank_registered_twice_fails_both_jobs_naming_both() {
    let port = free_port();
    let home = scratch_home("unnamed");
    let a0 = role_child("allreduce", (0, 3), port, &home, &[]);
    wait_for_root(port);
    let a1 = role_child("allreduce", (1, 3), port, &home, &[]);
    let b1 = role_child("allreduce", (1, 3), port, &home, &[]);
    let b0 = role_child("allreduce", (0, 3), port, &home, &[]);
    let (pid_a1, pid_b1) = (a1.id(), b1.id());
    let t = Instant::now();
    let outcomes = finish(vec![a0, a1, b1]);
    let took = t.elapsed();
    eprintln!("both jobs' registrants failed within {took:?}");
    for (ok, stderr) in &outcomes {
        assert!(
            !ok && stderr.contains("rank 1 registered twice")
                && stderr.contains(&format!("pid {pid_a1},"))
                && stderr.contains(&format!("pid {pid_b1},")),
            "{stderr}"
        );
    }
    // At once, not at the 20 s timeout.
    assert!(took < Duration::from_secs(10), "{took:?}");
    let [(ok, stderr)] = <[_; 1]>::try_from(finish(vec![b0])).unwrap();
    assert!(
        !ok && stderr.contains("another job or program is using this address"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&home).unwrap();
}

/// torchrun's agent serves its own store on MASTER_PORT (and says so with
/// TORCHELASTIC_USE_AGENT_STORE): the ranks meet on the next port.
#[test]
fn under_torchrun_the_rendezvous_leaves_master_port_to_its_store() {
    let (_store, port) = loop {
        let store = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = store.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            break (store, port);
        }
    };
    let home = scratch_home("torchrun");
    let torchrun = [
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
        ("TORCHELASTIC_RUN_ID", "8c5539b8"),
    ];
    let ranks = (0..2)
        .map(|r| role_child("allreduce", (r, 2), port, &home, &torchrun))
        .collect();
    for (ok, stderr) in finish(ranks) {
        assert!(ok, "{stderr}");
    }
    std::fs::remove_dir_all(&home).unwrap();
}
