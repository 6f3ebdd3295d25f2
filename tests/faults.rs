//! Faults injected into running communicators, with the time each takes
//! to reach the user: a rank SIGKILLed mid-all-reduce (shared memory and
//! TCP), a network link cut between two network namespaces, and hang
//! reports on a signal. Ranks are child processes of this test binary.
//!
//! Detection times are printed (`cargo test -- --nocapture`) and recorded
//! in docs/RELIABILITY.md.

#[path = "common/children.rs"]
mod children;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use children::{free_port, Ranks};
use rccl::{Communicator, RedOp};

const CHILD_MARKER: &str = "RCCL_FAULT_CHILD";
/// Elements each child rank all-reduces per call.
const COUNT_VAR: &str = "RCCL_FAULT_COUNT";
/// Set to a rank: that rank never calls, and the others make no warm-up
/// call (they wait for it in their first).
const IDLE_VAR: &str = "RCCL_FAULT_IDLE_RANK";
/// Set: the ranks run [`first_calls_that_differ`] instead.
const MISMATCH_VAR: &str = "RCCL_FAULT_MISMATCH";

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// One rank: a warm-up all-reduce, "READY", then all-reduces until one
/// fails; prints "FAILED <unix ms> <error>" and exits. With
/// [`IDLE_VAR`], "READY" comes right after init: the idle rank then
/// sleeps, the others start their all-reduces.
#[test]
fn fault_child_rank() {
    if std::env::var_os(CHILD_MARKER).is_none() {
        return;
    }
    let comm = Communicator::from_env().expect("init from the environment");
    if std::env::var_os(MISMATCH_VAR).is_some() {
        first_calls_that_differ(&comm);
    }
    let count = std::env::var(COUNT_VAR).map_or(1 << 16, |v| v.parse().unwrap());
    let mine = vec![comm.rank() as f32; count];
    let mut sum = vec![0f32; count];
    let idle: Option<usize> = std::env::var(IDLE_VAR).ok().map(|v| v.parse().unwrap());
    if idle.is_none() {
        comm.all_reduce(&mine, &mut sum, RedOp::Sum).unwrap();
    }
    println!("READY {}", comm.rank());
    if idle == Some(comm.rank()) {
        // Killed by the test; bounded, should its runner lose it.
        std::thread::sleep(Duration::from_secs(60));
        return;
    }
    loop {
        if let Err(err) = comm.all_reduce(&mine, &mut sum, RedOp::Sum) {
            println!(
                "FAILED {} {}",
                now_ms(),
                err.to_string().replace('\n', " | ")
            );
            std::process::exit(0);
        }
    }
}

/// What the children print, line by line, tagged with their rank.
fn collect_lines(ranks: &mut Ranks) -> mpsc::Receiver<(usize, String)> {
    let (tx, rx) = mpsc::channel();
    for (rank, child) in ranks.0.iter_mut().enumerate() {
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                // libtest may print "test name ... " in front.
                let at = ["READY", "FAILED"]
                    .iter()
                    .filter_map(|m| line.find(m))
                    .min()
                    .unwrap_or(0);
                let _ = tx.send((rank, line[at..].to_string()));
            }
        });
    }
    rx
}

fn wait_ready(rx: &mpsc::Receiver<(usize, String)>, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut ready = 0;
    while ready < n {
        let left = deadline.saturating_duration_since(Instant::now());
        let (rank, line) = rx.recv_timeout(left).expect("ranks did not get ready");
        if line.starts_with("READY") {
            ready += 1;
        } else if line.starts_with("FAILED") {
            panic!("rank {rank} failed before the fault: {line}");
        }
    }
}

/// Collects each survivor's "FAILED" line: (rank, detection ms, error).
fn failures(
    rx: &mpsc::Receiver<(usize, String)>,
    survivors: &[usize],
    fault_ms: u128,
) -> Vec<(usize, u128, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut got = Vec::new();
    while got.len() < survivors.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((rank, line)) = rx.recv_timeout(left) else {
            panic!("only {got:?} of ranks {survivors:?} reported an error within 20 s");
        };
        if let Some(rest) = line.strip_prefix("FAILED ") {
            let (ms, text) = rest.split_once(' ').unwrap();
            let ms: u128 = ms.parse().unwrap();
            got.push((rank, ms.saturating_sub(fault_ms), text.to_string()));
        }
    }
    got.sort();
    got
}

/// Starts `cmd` as `rank` of a job meeting at `addr:port`, with a 3 s
/// timeout unless `cmd` sets `RCCL_TIMEOUT_MS`.
fn spawn_rank(cmd: &mut Command, rank: usize, nranks: usize, addr: &str, port: &str) -> Child {
    if !cmd.get_envs().any(|(key, _)| key == "RCCL_TIMEOUT_MS") {
        cmd.env("RCCL_TIMEOUT_MS", "3000");
    }
    cmd.args([
        "--exact",
        "fault_child_rank",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env(CHILD_MARKER, "1")
    .env("RANK", rank.to_string())
    .env("WORLD_SIZE", nranks.to_string())
    .env("MASTER_ADDR", addr)
    .env("MASTER_PORT", port)
    .env("NCCL_BUFFSIZE", (64 << 10).to_string())
    .env("NCCL_MIN_NCHANNELS", "2")
    .env("NCCL_MAX_NCHANNELS", "2")
    .env_remove("RCCL_HANG_REPORT_SIGNAL")
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap()
}

fn shm_names_of(pids: &[u32]) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| pids.iter().any(|p| name.starts_with(&format!("rccl-{p}-"))))
                .collect()
        })
        .unwrap_or_default()
}

/// Kills one of four ranks looping over all-reduces of `count` floats.
fn kill_one_of_four(shm_disable: bool, count: usize) {
    let (nranks, victim) = (4, 2);
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    let mut ranks = Ranks(
        (0..nranks)
            .map(|rank| {
                let mut cmd = Command::new(&exe);
                cmd.env("NCCL_SHM_DISABLE", if shm_disable { "1" } else { "0" })
                    .env(COUNT_VAR, count.to_string());
                spawn_rank(&mut cmd, rank, nranks, "127.0.0.1", &port)
            })
            .collect(),
    );
    let pids: Vec<u32> = ranks.0.iter().map(Child::id).collect();
    let rx = collect_lines(&mut ranks);
    wait_ready(&rx, nranks);
    std::thread::sleep(Duration::from_millis(200));
    let killed = now_ms();
    ranks.0[victim].kill().unwrap();
    ranks.0[victim].wait().unwrap();
    let survivors: Vec<usize> = (0..nranks).filter(|&r| r != victim).collect();
    let got = failures(&rx, &survivors, killed);
    let transport = match (shm_disable, count) {
        (true, _) => "TCP",
        (false, 1024) => "the board",
        (false, _) => "shared memory",
    };
    for (rank, ms, text) in &got {
        println!(
            "SIGKILL of rank {victim} over {transport}: rank {rank} failed after {ms} ms: {text}"
        );
    }
    for (rank, ms, text) in &got {
        assert!(*ms < 10_000, "rank {rank} took {ms} ms");
        assert!(
            text.contains(&format!("rank {victim} ")),
            "rank {rank} does not name the dead rank: {text}"
        );
    }
    if !shm_disable {
        // The dead rank is seen by its process going away, well before
        // the 3 s timeout.
        assert!(got.iter().all(|(_, ms, _)| *ms < 2_500), "{got:?}");
        assert!(got.iter().any(|(_, _, t)| t.contains("died")), "{got:?}");
    }
    for child in &mut ranks.0 {
        let _ = child.wait();
    }
    let left = shm_names_of(&pids);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// Kills one of four ranks right after init, before its first call,
/// while the others wait for it in theirs (connection setup), with a 15 s
/// timeout: each survivor fails within 2 s, naming the dead rank, seen by
/// its process going away or its bootstrap connection closing (or told
/// by a survivor that saw it).
fn kill_one_of_four_before_its_first_call(shm_disable: bool, count: usize) -> Vec<u128> {
    let (nranks, victim) = (4, 2);
    let port = free_port().to_string();
    let exe = std::env::current_exe().unwrap();
    let mut ranks = Ranks(
        (0..nranks)
            .map(|rank| {
                let mut cmd = Command::new(&exe);
                cmd.env("NCCL_SHM_DISABLE", if shm_disable { "1" } else { "0" })
                    .env(COUNT_VAR, count.to_string())
                    .env(IDLE_VAR, victim.to_string())
                    .env("RCCL_TIMEOUT_MS", "15000");
                spawn_rank(&mut cmd, rank, nranks, "127.0.0.1", &port)
            })
            .collect(),
    );
    let rx = collect_lines(&mut ranks);
    wait_ready(&rx, nranks);
    std::thread::sleep(Duration::from_millis(300));
    let killed = now_ms();
    ranks.0[victim].kill().unwrap();
    ranks.0[victim].wait().unwrap();
    let survivors: Vec<usize> = (0..nranks).filter(|&r| r != victim).collect();
    let got = failures(&rx, &survivors, killed);
    for (rank, ms, text) in &got {
        println!(
            "SIGKILL of rank {victim} before its first call (NCCL_SHM_DISABLE={}, {count} \
             floats): rank {rank} failed after {ms} ms: {text}",
            u8::from(shm_disable)
        );
    }
    for (rank, ms, text) in &got {
        assert!(*ms < 2_000, "rank {rank} took {ms} ms: {text}");
        assert!(
            text.contains(&format!("rank {victim} ")),
            "rank {rank} does not name the dead rank: {text}"
        );
    }
    got.into_iter().map(|(_, ms, _)| ms).collect()
}

#[test]
fn a_rank_killed_before_its_first_call_fails_the_others_in_setup() {
    // Shared memory, the board (4 KiB per rank) and TCP.
    for (shm_disable, count) in [(false, 1 << 16), (false, 1024), (true, 1 << 16)] {
        kill_one_of_four_before_its_first_call(shm_disable, count);
    }
}

/// Rank 0 of 2 in a first call that differs from rank 1's; both wait for
/// the other's side of their connections, so the difference shows only
/// through what each tells the other. Rank 0 calls 500 ms after rank 1,
/// so it sees the mismatch first; it prints "FAILED ..." and exits at
/// once, and rank 1 prints the error it got.
fn first_calls_that_differ(comm: &Communicator) -> ! {
    let mut buf = vec![1f32; 1 << 12];
    let result = if comm.rank() == 0 {
        std::thread::sleep(Duration::from_millis(500));
        comm.broadcast_in_place(&mut buf, 0)
    } else {
        let mine = buf.clone();
        comm.all_reduce(&mine, &mut buf, RedOp::Sum)
    };
    let err = result.expect_err("the calls differ");
    println!(
        "FAILED {} {}",
        now_ms(),
        err.to_string().replace('\n', " | ")
    );
    std::process::exit(0);
}

#[test]
fn a_rank_that_exits_right_after_a_mismatch_tells_its_peer_the_mismatch() {
    let exe = std::env::current_exe().unwrap();
    for run in 0..3 {
        let port = free_port().to_string();
        let mut ranks = Ranks(
            (0..2)
                .map(|rank| {
                    let mut cmd = Command::new(&exe);
                    cmd.env(MISMATCH_VAR, "1").env("RCCL_TIMEOUT_MS", "15000");
                    spawn_rank(&mut cmd, rank, 2, "127.0.0.1", &port)
                })
                .collect(),
        );
        let rx = collect_lines(&mut ranks);
        let got = failures(&rx, &[0, 1], 0);
        for (rank, _, text) in &got {
            println!("mismatch, run {run}: rank {rank}: {text}");
            assert!(
                text.contains("Broadcast") && text.contains("AllReduce"),
                "rank {rank} does not name both calls: {text}"
            );
        }
    }
}

#[test]
fn sigkill_of_one_of_four_ranks_over_shared_memory() {
    kill_one_of_four(false, 1 << 16);
}

#[test]
fn sigkill_of_one_of_four_ranks_waiting_on_the_board() {
    // 4 KiB per rank: one-shot through the board.
    kill_one_of_four(false, 1024);
}

#[test]
fn sigkill_of_one_of_four_ranks_over_tcp() {
    kill_one_of_four(true, 1 << 16);
}

/// Runs `ip` with `args`, true on success.
fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Two network namespaces joined by a veth pair, removed on drop.
struct Namespaces {
    names: [String; 2],
    veths: [String; 2],
}

impl Namespaces {
    fn create() -> Result<Namespaces, String> {
        // Tests of one process running side by side get their own pairs.
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let made = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = (std::process::id() % 10_000) * 10 + made % 10;
        let names = [format!("rccl-fa-{id}"), format!("rccl-fb-{id}")];
        let veths = [format!("rva{id}"), format!("rvb{id}")];
        let ns = Namespaces { names, veths };
        let [a, b] = &ns.names;
        let [va, vb] = &ns.veths;
        let steps: Vec<Vec<&str>> = vec![
            vec!["netns", "add", a],
            vec!["netns", "add", b],
            vec!["link", "add", va, "type", "veth", "peer", "name", vb],
            vec!["link", "set", va, "netns", a],
            vec!["link", "set", vb, "netns", b],
            vec!["-n", a, "addr", "add", "10.231.0.1/24", "dev", va],
            vec!["-n", b, "addr", "add", "10.231.0.2/24", "dev", vb],
            vec!["-n", a, "link", "set", va, "up"],
            vec!["-n", b, "link", "set", vb, "up"],
            vec!["-n", a, "link", "set", "lo", "up"],
            vec!["-n", b, "link", "set", "lo", "up"],
        ];
        for step in steps {
            if !ip(&step) {
                return Err(format!("`ip {}` failed", step.join(" ")));
            }
        }
        Ok(ns)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in &self.names {
            ip(&["netns", "del", name]);
        }
    }
}

#[test]
fn link_cut_between_two_hosts_is_reported_naming_the_peer_and_its_host() {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root || !ip(&["-V"]) {
        println!("SKIPPED link cut test: needs root and iproute2 (`ip`)");
        return;
    }
    let ns = match Namespaces::create() {
        Ok(ns) => ns,
        Err(why) => {
            println!("SKIPPED link cut test: cannot build network namespaces: {why}");
            return;
        }
    };
    let exe = std::env::current_exe().unwrap();
    let port = "29517";
    let mut ranks = Ranks(
        (0..2)
            .map(|rank| {
                let mut cmd = Command::new("ip");
                cmd.args(["netns", "exec", &ns.names[rank]])
                    .arg(&exe)
                    .env("NCCL_SOCKET_IFNAME", &ns.veths[rank])
                    .env("NCCL_HOSTID", format!("host-{rank}"));
                spawn_rank(&mut cmd, rank, 2, "10.231.0.1", port)
            })
            .collect(),
    );
    let rx = collect_lines(&mut ranks);
    wait_ready(&rx, 2);
    std::thread::sleep(Duration::from_millis(200));
    let cut = now_ms();
    assert!(ip(&[
        "-n",
        &ns.names[0],
        "link",
        "set",
        &ns.veths[0],
        "down"
    ]));
    let got = failures(&rx, &[0, 1], cut);
    for (rank, ms, text) in &got {
        println!("link cut: rank {rank} failed after {ms} ms: {text}");
    }
    for (rank, ms, text) in &got {
        let (peer, peer_ip) = if *rank == 0 {
            (1, "10.231.0.2")
        } else {
            (0, "10.231.0.1")
        };
        assert!(*ms < 10_000, "rank {rank} took {ms} ms");
        assert!(
            text.contains(&format!("rank {peer} (host ")) && text.contains(peer_ip),
            "rank {rank} does not name rank {peer} and its host: {text}"
        );
    }
    drop(ranks);
    drop(ns);
}

/// A rank blocked in a receive nobody answers (it waits for the peer to
/// set up its side of their connection), with hang reports on SIGUSR1
/// (from the environment).
#[test]
fn hang_child() {
    if std::env::var_os("RCCL_HANG_CHILD").is_none() {
        return;
    }
    let comms = Communicator::init_all(2).unwrap();
    // A line on standard input aborts the wait, so the process ends
    // normally and removes what it created.
    let aborter = comms[0].clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_line(&mut String::new());
        aborter.abort();
    });
    println!("READY");
    let mut buf = [0u8; 64];
    let _ = comms[0].recv(&mut buf, 1);
}

#[test]
fn sigusr1_prints_what_every_communicator_waits_for() {
    let exe = std::env::current_exe().unwrap();
    let mut child = Ranks(vec![Command::new(&exe)
        .args([
            "--exact",
            "hang_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("RCCL_HANG_CHILD", "1")
        .env("RCCL_HANG_REPORT_SIGNAL", "SIGUSR1")
        .env("RCCL_TIMEOUT_MS", "20000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()]);
    let mut out = BufReader::new(child.0[0].stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("READY") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
    }
    let pid = child.0[0].id() as i32;
    let err = child.0[0].stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    let mut next_signal = Instant::now();
    while !seen
        .iter()
        .any(|l: &String| l.contains("waiting for rank 1 (host"))
    {
        assert!(
            Instant::now() < deadline,
            "no report naming rank 1: {seen:?}"
        );
        if Instant::now() >= next_signal {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid, libc::SIGUSR1) };
            next_signal = Instant::now() + Duration::from_millis(300);
        }
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            seen.push(line);
        }
    }
    let text = seen.join("\n");
    println!("{text}");
    assert!(
        text.contains("rank 0 of 2: operation #0 Send/Recv in flight"),
        "{text}"
    );
    assert!(
        text.contains("rank 1 of 2: no operation in flight"),
        "{text}"
    );
    // End the child through abort and check it left nothing in /dev/shm.
    use std::io::Write;
    child.0[0].stdin.take().unwrap().write_all(b"\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.0[0].try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the child did not end after abort"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = shm_names_of(&[pid as u32]);
    assert!(left.is_empty(), "left in /dev/shm: {left:?}");
}

/// Tries init with the environment's `RCCL_HANG_REPORT_SIGNAL`, prints
/// "INIT <outcome>", then waits for standard input to close.
#[test]
fn signal_child() {
    if std::env::var_os("RCCL_SIGNAL_CHILD").is_none() {
        return;
    }
    match Communicator::init_all(2) {
        Ok(_) => println!("INIT ok"),
        Err(err) => println!("INIT code {} {err}", err.code()),
    }
    let _ = std::io::stdin().read_line(&mut String::new());
}

#[test]
fn a_hang_report_signal_that_means_something_else_fails_init_and_sigterm_still_stops() {
    use std::os::unix::process::ExitStatusExt;
    let exe = std::env::current_exe().unwrap();
    let mut child = Ranks(vec![Command::new(&exe)
        .args([
            "--exact",
            "signal_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("RCCL_SIGNAL_CHILD", "1")
        .env("RCCL_HANG_REPORT_SIGNAL", "15")
        .env("RCCL_TIMEOUT_MS", "20000")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()]);
    let mut out = BufReader::new(child.0[0].stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("INIT") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
    }
    println!("{}", line.trim());
    assert!(
        line.contains("INIT code 4 invalid argument: RCCL_HANG_REPORT_SIGNAL=15: SIGTERM (15)"),
        "{line}"
    );
    // The handler was not installed: SIGTERM keeps its default action.
    let pid = child.0[0].id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.0[0].try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "SIGTERM did not stop the child");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(libc::SIGTERM), "{status:?}");
}

/// Two ranks of one process all-reduce `RCCL_FAULT_COUNT` floats once
/// each and print "SHM <rank> <ms after the call began> <outcome>".
#[test]
fn shm_space_child() {
    if std::env::var_os("RCCL_SHM_SPACE_CHILD").is_none() {
        return;
    }
    let count: usize = std::env::var(COUNT_VAR).unwrap().parse().unwrap();
    let comms = Communicator::init_all(2).unwrap();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let mine = vec![1f32; count];
                let mut sum = vec![0f32; count];
                let began = Instant::now();
                let outcome = comm.all_reduce(&mine, &mut sum, RedOp::Sum);
                println!(
                    "SHM {} {} {:?}",
                    comm.rank(),
                    began.elapsed().as_millis(),
                    outcome
                );
            });
        }
    });
}

/// Why a small `/dev/shm` cannot be given to a child, if it cannot: that
/// needs root and `unshare` (a private mount namespace).
fn small_dev_shm_unavailable() -> Option<String> {
    let made = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1m none /dev/shm"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    match made {
        Ok(status) if status.success() => None,
        Ok(status) => Some(format!(
            "`unshare -m` + mount failed ({status}): needs root"
        )),
        Err(e) => Some(format!("no `unshare`: {e}")),
    }
}

/// Runs [`shm_space_child`] with a `/dev/shm` of `mib` MiB and `env`;
/// returns each rank's time to fail and error.
fn all_reduce_with_a_small_dev_shm(
    mib: usize,
    count: usize,
    env: &[(&str, &str)],
) -> Vec<(u128, String)> {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new("unshare");
    cmd.args([
        "-m",
        "sh",
        "-c",
        &format!(r#"mount -t tmpfs -o size={mib}m none /dev/shm && exec "$0" "$@""#),
    ])
    .arg(&exe)
    .args([
        "--exact",
        "shm_space_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("RCCL_SHM_SPACE_CHILD", "1")
    .env(COUNT_VAR, count.to_string())
    .env("NCCL_MIN_NCHANNELS", "1")
    .env("NCCL_MAX_NCHANNELS", "1")
    .env("RCCL_TIMEOUT_MS", "20000")
    .env_remove("RCCL_HANG_REPORT_SIGNAL")
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    for (name, value) in env {
        cmd.env(name, value);
    }
    let mut child = Ranks(vec![cmd.spawn().unwrap()]);
    let out = child.0[0].stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(out)
            .lines()
            .map_while(Result::ok)
            .filter_map(|line| Some(line[line.find("SHM ")?..].to_string()))
            .collect::<Vec<_>>()
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(status) = child.0[0].try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the child did not end within 15 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let lines = reader.join().unwrap();
    assert!(
        status.success(),
        "the child ended with {status:?}: {lines:?}"
    );
    let mut got: Vec<(usize, u128, String)> = lines
        .iter()
        .map(|line| {
            let mut parts = line.splitn(4, ' ').skip(1);
            let rank = parts.next().unwrap().parse().unwrap();
            let ms = parts.next().unwrap().parse().unwrap();
            (rank, ms, parts.next().unwrap().to_string())
        })
        .collect();
    got.sort();
    assert_eq!(got.len(), 2, "{lines:?}");
    got.into_iter().map(|(_, ms, text)| (ms, text)).collect()
}

/// Both ranks fail soon, saying what is missing and what to change
/// (`setting`: what sizes the segment).
fn assert_both_ranks_name_dev_shm(got: &[(u128, String)], mib: usize, what: &str, setting: &str) {
    let size = format!("free of {mib}.0 MiB");
    for (rank, (ms, text)) in got.iter().enumerate() {
        println!("{what}, {mib} MiB /dev/shm: rank {rank} failed after {ms} ms: {text}");
        assert!(*ms < 5_000, "rank {rank} took {ms} ms: {text}");
        for needed in ["/dev/shm has no room", &size, setting, "NCCL_SHM_DISABLE=1"] {
            assert!(
                text.contains(needed),
                "rank {rank} does not say {needed:?}: {text}"
            );
        }
    }
    assert!(
        got[1].1.contains("rank 0 "),
        "rank 1 does not name rank 0: {}",
        got[1].1
    );
}

#[test]
fn a_dev_shm_too_small_for_the_fifos_fails_both_ranks_naming_it() {
    if let Some(why) = small_dev_shm_unavailable() {
        println!("SKIPPED small /dev/shm test: {why}");
        return;
    }
    // 4 MiB FIFOs: the pair's segment needs over 8 MiB.
    let got = all_reduce_with_a_small_dev_shm(1, 1 << 18, &[("NCCL_BUFFSIZE", "4194304")]);
    assert_both_ranks_name_dev_shm(&got, 1, "FIFO segment", "NCCL_BUFFSIZE");
}

#[test]
fn a_dev_shm_too_small_for_the_board_fails_both_ranks_naming_it() {
    if let Some(why) = small_dev_shm_unavailable() {
        println!("SKIPPED small /dev/shm test: {why}");
        return;
    }
    // A 1 MiB all-reduce through a board of 2 ranks x 2 posts of 1 MiB
    // (NCCL_ALGO=oneshot: the board is made before any FIFO).
    let got = all_reduce_with_a_small_dev_shm(
        1,
        1 << 18,
        &[("RCCL_BOARD_BYTES", "1048576"), ("NCCL_ALGO", "oneshot")],
    );
    assert_both_ranks_name_dev_shm(&got, 1, "board", "RCCL_BOARD_BYTES");
}

/// Lowers this process's open-file limit to `RCCL_FD_LIMIT`, then inits
/// (8 ranks of this process, or one rank from the environment when `RANK`
/// is set) and all-reduces once; prints "FD <ms> <outcome>".
#[test]
fn fd_limit_child() {
    let Some(limit) = std::env::var("RCCL_FD_LIMIT").ok() else {
        return;
    };
    let limit: libc::rlim_t = limit.parse().unwrap();
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: valid out-pointer, then a valid limit for this process.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut old), 0);
        let new = libc::rlimit {
            rlim_cur: limit,
            rlim_max: old.rlim_max,
        };
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &new), 0);
    }
    let began = Instant::now();
    let comms = if std::env::var_os("RANK").is_some() {
        Communicator::from_env().map(|comm| vec![comm])
    } else {
        Communicator::init_all(8)
    };
    let outcome = comms.and_then(|comms| {
        std::thread::scope(|s| {
            let calls: Vec<_> = comms
                .iter()
                .map(|comm| {
                    s.spawn(move || {
                        let mut sum = [0f32; 1024];
                        comm.all_reduce(&[1f32; 1024], &mut sum, RedOp::Sum)
                    })
                })
                .collect();
            calls.into_iter().try_for_each(|call| call.join().unwrap())
        })
    });
    println!(
        "FD {} {}",
        began.elapsed().as_millis(),
        match outcome {
            Ok(()) => "ok".to_string(),
            Err(err) => err.to_string(),
        }
    );
}

/// The "FD" lines of `children` (each killed at the deadline): (ms, text).
fn fd_outcomes(children: &mut Ranks) -> Vec<(u128, String)> {
    let rx = {
        let (tx, rx) = mpsc::channel();
        for child in &mut children.0 {
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(at) = line.find("FD ") {
                        let _ = tx.send(line[at + 3..].to_string());
                    }
                }
            });
        }
        rx
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    (0..children.0.len())
        .map(|_| {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).expect("a child printed no outcome");
            let (ms, text) = line.split_once(' ').unwrap();
            (ms.parse().unwrap(), text.to_string())
        })
        .collect()
}

fn fd_limit_command(limit: usize) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "fd_limit_child",
        "--nocapture",
        "--test-threads",
        "1",
    ])
    .env("RCCL_FD_LIMIT", limit.to_string())
    .env("RCCL_TIMEOUT_MS", "30000")
    .env_remove("RCCL_HANG_REPORT_SIGNAL")
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    cmd
}

/// The error names EMFILE and what to do, well before the 30 s timeout.
fn assert_reports_the_fd_limit(ms: u128, text: &str, limit: usize) {
    assert!(ms < 5_000, "took {ms} ms: {text}");
    for needed in [
        "too many open files (EMFILE)",
        &format!("limit of {limit} open files"),
        "ulimit -n",
    ] {
        assert!(text.contains(needed), "does not say {needed:?}: {text}");
    }
}

#[test]
fn running_out_of_file_descriptors_in_one_process_is_reported_at_once() {
    // Each limit runs out at another step of init: a socket pair, the data
    // listener, a connection to a peer, the bootstrap listener's accept.
    for limit in (32..=46).step_by(2) {
        let mut child = Ranks(vec![fd_limit_command(limit).spawn().unwrap()]);
        let (ms, text) = fd_outcomes(&mut child).remove(0);
        println!("8 ranks of one process, ulimit -n {limit}: init failed after {ms} ms: {text}");
        assert_reports_the_fd_limit(ms, &text, limit);
    }
}

#[test]
fn running_out_of_file_descriptors_at_the_root_is_reported_to_the_ranks() {
    // 12 descriptors: the root, in rank 0's process, runs out while the 8
    // ranks register.
    let port = free_port().to_string();
    let mut ranks = Ranks(
        (0..8)
            .map(|rank| {
                fd_limit_command(12)
                    .env("RANK", rank.to_string())
                    .env("WORLD_SIZE", "8")
                    .env("MASTER_ADDR", "127.0.0.1")
                    .env("MASTER_PORT", &port)
                    .spawn()
                    .unwrap()
            })
            .collect(),
    );
    let rx = {
        let (tx, rx) = mpsc::channel();
        for (rank, child) in ranks.0.iter_mut().enumerate() {
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(at) = line.find("FD ") {
                        let _ = tx.send((rank, line[at + 3..].to_string()));
                    }
                }
            });
        }
        rx
    };
    // What arrives within 3 s (the timeout is 30 s).
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut got = Vec::new();
    while got.len() < 8 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((rank, line)) = rx.recv_timeout(left) else {
            break;
        };
        let (ms, text) = line.split_once(' ').unwrap();
        println!("8 processes, ulimit -n 12: rank {rank} failed after {ms} ms: {text}");
        got.push((rank, ms.parse::<u128>().unwrap(), text.to_string()));
    }
    let (_, ms, text) = got
        .iter()
        .find(|(rank, _, _)| *rank == 0)
        .expect("rank 0 reported nothing within 3 s");
    assert_reports_the_fd_limit(*ms, text, 12);
    for (rank, _, text) in &got {
        assert!(
            !text.contains("timed out"),
            "rank {rank} blames a timeout: {text}"
        );
    }
}

/// Faults injected into the verbs model under the IB network between two
/// namespace hosts (`RCCL_IB_MODEL_FAULT` on one rank, after its NIC sent
/// 2000 frames): the port going down, a corrupted key, a stall past the
/// retries (`NCCL_IB_TIMEOUT=14`, `NCCL_IB_RETRY_CNT=2`: about 200 ms).
/// Both ranks fail, each naming the other, within 2 s of each other; a
/// dropped port or a corrupted key before the engine's timeout (3 s). A
/// stalled NIC is seen by the retries of a rank with frames in flight to
/// it; when the stall comes while the other rank only waits to receive
/// (its frames all answered, the stalled NIC holding back its own), there
/// is nothing to retry, and both see the engine's timeout, which names
/// the peer as well.
#[test]
fn ib_model_faults_fail_both_ranks_naming_each_other() {
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    if !root || !ip(&["-V"]) {
        println!("SKIPPED IB fault test: needs root and iproute2 (`ip`)");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    for (fault, on) in [
        ("drop:2000", 0),
        ("corrupt:2000", 0),
        ("stall:2000:5000", 1),
    ] {
        let ns = match Namespaces::create() {
            Ok(ns) => ns,
            Err(why) => {
                println!("SKIPPED IB fault test: cannot build network namespaces: {why}");
                return;
            }
        };
        let port = free_port().to_string();
        let mut ranks = Ranks(
            (0..2)
                .map(|rank| {
                    let mut cmd = Command::new("ip");
                    cmd.args(["netns", "exec", &ns.names[rank]])
                        .arg(&exe)
                        .env("NCCL_SOCKET_IFNAME", &ns.veths[rank])
                        .env("NCCL_HOSTID", format!("host-{rank}"))
                        .env("NCCL_NET", "IB")
                        .env("RCCL_IB_MODEL", "1")
                        .env("NCCL_IB_TIMEOUT", "14")
                        .env("NCCL_IB_RETRY_CNT", "2");
                    if rank == on {
                        cmd.env("RCCL_IB_MODEL_FAULT", fault);
                    } else {
                        cmd.env_remove("RCCL_IB_MODEL_FAULT");
                    }
                    spawn_rank(&mut cmd, rank, 2, "10.231.0.1", &port)
                })
                .collect(),
        );
        let rx = collect_lines(&mut ranks);
        wait_ready(&rx, 2);
        let got = failures(&rx, &[0, 1], 0);
        let first = got.iter().map(|(_, ms, _)| *ms).min().unwrap();
        for (rank, ms, text) in &got {
            println!(
                "IB model {fault} on rank {on}: rank {rank} failed {} ms after the first: {text}",
                ms - first
            );
        }
        for (rank, ms, text) in &got {
            let peer = 1 - rank;
            assert!(
                ms - first < 2_000,
                "rank {rank} took {} ms more",
                ms - first
            );
            assert!(
                text.contains(&format!("rank {peer} (host ")),
                "rank {rank} does not name rank {peer}: {text}"
            );
            assert!(
                fault.starts_with("stall")
                    || !text.contains("timed out") && !text.contains("timeout"),
                "rank {rank} waited for the engine's timeout: {text}"
            );
        }
        drop(ranks);
        drop(ns);
    }
}
