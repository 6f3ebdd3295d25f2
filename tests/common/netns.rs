//! A multi-host test bed of network namespaces, the Rust counterpart of
//! `scripts/testbed.sh` (same shape and names): `hosts` namespaces, each
//! with one veth per rail (`tb<r>`, 10.231.<r>.<i+1>/24) into that rail's
//! bridge (`br<r>`) in a "switch" namespace, unshaped. Ranks run inside
//! their host's namespace through `ip netns exec` with the torchrun
//! variables, `NCCL_SOCKET_IFNAME=tb0` (`tb`, every rail, with several)
//! and `NCCL_HOSTID=host<i>`. Dropping the bed kills its ranks and deletes
//! every namespace it made, also when a test panics; beds left behind by a
//! killed test process are swept by the next one.

#![allow(dead_code)]

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The interface of each host namespace.
pub const IFACE: &str = "tb0";

/// Host `i`'s address (on rail 0).
pub fn host_addr(host: usize) -> String {
    rail_addr(host, 0)
}

/// Host `i`'s address on rail `rail`.
pub fn rail_addr(host: usize, rail: usize) -> String {
    format!("10.231.{rail}.{}", host + 1)
}

/// Why multi-host tests cannot run here, if they cannot: not root, no
/// `ip`, or namespaces not permitted.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(out) if out.status.success() => {}
        _ => return Some("'ip' (iproute2) is missing".into()),
    }
    let probe = format!("{}-probe", bed_name());
    let ok = ip(&["netns", "add", &probe]).is_ok();
    let _ = ip(&["netns", "del", &probe]);
    if !ok {
        return Some("creating a network namespace failed".into());
    }
    None
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn bed_name() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "rccl-tb-{}-t{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

fn namespaces() -> Vec<String> {
    Command::new("ip")
        .args(["netns", "list"])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Deletes namespaces `rccl-tb-<pid>-*` of processes that no longer exist
/// (beds of a test run that was killed), except beds that
/// `scripts/testbed.sh up` made to keep (`OWNER=none` in their state file).
fn sweep_stale() {
    let state_dir =
        std::env::var("RCCL_TB_DIR").unwrap_or_else(|_| "/run/rccl-testbed".to_string());
    for ns in namespaces() {
        let Some(rest) = ns.strip_prefix("rccl-tb-") else {
            continue;
        };
        let Some((pid, tail)) = rest.split_once('-') else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        let bed = format!("rccl-tb-{pid}-{}", tail.split('-').next().unwrap_or(""));
        let kept = std::fs::read_to_string(format!("{state_dir}/{bed}.env"))
            .map(|s| s.lines().any(|l| l == "OWNER=none"))
            .unwrap_or(false);
        if !kept && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", &ns]);
        }
    }
}

/// A running bed; see the module documentation.
pub struct TestBed {
    name: String,
    hosts: usize,
    per_host: usize,
    rails: usize,
    made: Vec<String>,
    ranks: Vec<Child>,
    runs: usize,
}

impl TestBed {
    /// Builds `hosts` host namespaces for `per_host` ranks each.
    pub fn up(hosts: usize, per_host: usize) -> Result<TestBed, String> {
        TestBed::with_rails(hosts, per_host, 1)
    }

    /// Builds `hosts` host namespaces for `per_host` ranks each, joined by
    /// `rails` networks (a bridge each, one veth per host on each).
    pub fn with_rails(hosts: usize, per_host: usize, rails: usize) -> Result<TestBed, String> {
        sweep_stale();
        let mut bed = TestBed {
            name: bed_name(),
            hosts,
            per_host,
            rails,
            made: Vec::new(),
            ranks: Vec::new(),
            runs: 0,
        };
        // On error, `bed` drops and removes what was made so far.
        let sw = bed.add_ns("sw")?;
        ip(&["-n", &sw, "link", "set", "lo", "up"])?;
        for rail in 0..rails {
            let bridge = format!("br{rail}");
            ip(&["-n", &sw, "link", "add", &bridge, "type", "bridge"])?;
            ip(&["-n", &sw, "link", "set", &bridge, "up"])?;
        }
        for host in 0..hosts {
            let ns = bed.add_ns(&format!("h{host}"))?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            for rail in 0..rails {
                // Rail 0 keeps the single-rail bed's names.
                let (port, iface) = if rail == 0 {
                    (format!("p{host}"), IFACE.to_string())
                } else {
                    (format!("p{host}r{rail}"), format!("tb{rail}"))
                };
                ip(&[
                    "-n", &sw, "link", "add", &port, "type", "veth", "peer", "name", &iface,
                    "netns", &ns,
                ])?;
                ip(&[
                    "-n",
                    &sw,
                    "link",
                    "set",
                    &port,
                    "master",
                    &format!("br{rail}"),
                ])?;
                ip(&["-n", &sw, "link", "set", &port, "up"])?;
                let addr = format!("{}/24", rail_addr(host, rail));
                ip(&["-n", &ns, "addr", "add", &addr, "dev", &iface])?;
                ip(&["-n", &ns, "link", "set", &iface, "up"])?;
            }
        }
        Ok(bed)
    }

    fn add_ns(&mut self, suffix: &str) -> Result<String, String> {
        let ns = format!("{}-{suffix}", self.name);
        ip(&["netns", "add", &ns])?;
        self.made.push(ns.clone());
        Ok(ns)
    }

    /// Bytes host `host` has sent on rail `rail` so far.
    pub fn sent_bytes(&self, host: usize, rail: usize) -> u64 {
        let iface = if rail == 0 {
            IFACE.to_string()
        } else {
            format!("tb{rail}")
        };
        Command::new("ip")
            .args(["netns", "exec", &self.host_ns(host), "cat"])
            .arg(format!("/sys/class/net/{iface}/statistics/tx_bytes"))
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(0)
    }

    /// The namespace of host `host`.
    pub fn host_ns(&self, host: usize) -> String {
        format!("{}-h{host}", self.name)
    }

    pub fn world(&self) -> usize {
        self.hosts * self.per_host
    }

    /// Starts one process per rank: `program args`, rank r on host
    /// r / per_host, with the bed's environment; `configure` adds to each
    /// command (more variables, stdio).
    pub fn spawn(
        &mut self,
        program: &std::path::Path,
        args: &[&str],
        configure: impl Fn(usize, &mut Command),
    ) -> Result<(), String> {
        assert!(self.ranks.is_empty(), "ranks of an earlier run still held");
        // A fresh rendezvous port per run: no TIME_WAIT leftovers.
        let port = (29500 + self.runs).to_string();
        self.runs += 1;
        let world = self.world();
        for rank in 0..world {
            let host = rank / self.per_host;
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &self.host_ns(host)])
                .arg(program)
                .args(args)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", (rank % self.per_host).to_string())
                .env("LOCAL_WORLD_SIZE", self.per_host.to_string())
                .env("MASTER_ADDR", host_addr(0))
                .env("MASTER_PORT", &port)
                .env(
                    "NCCL_SOCKET_IFNAME",
                    if self.rails > 1 { "tb" } else { IFACE },
                )
                .env("NCCL_HOSTID", format!("host{host}"))
                .stdin(Stdio::null());
            configure(rank, &mut cmd);
            let child = cmd
                .spawn()
                .map_err(|e| format!("starting rank {rank}: {e}"))?;
            self.ranks.push(child);
        }
        Ok(())
    }

    /// Waits for every rank of the last `spawn`, at most `limit`; when one
    /// fails or time runs out the others are killed. Returns each rank's
    /// status (None: killed at the deadline) and its captured stderr, if
    /// it was piped.
    pub fn wait(&mut self, limit: Duration) -> Vec<(Option<ExitStatus>, String)> {
        let deadline = Instant::now() + limit;
        let mut ranks = std::mem::take(&mut self.ranks);
        // Drain piped stderr on threads so ranks never block on a full pipe.
        let readers: Vec<_> = ranks
            .iter_mut()
            .map(|c| {
                c.stderr.take().map(|mut e| {
                    std::thread::spawn(move || {
                        let mut s = String::new();
                        let _ = std::io::Read::read_to_string(&mut e, &mut s);
                        s
                    })
                })
            })
            .collect();
        let mut status: Vec<Option<ExitStatus>> = vec![None; ranks.len()];
        loop {
            for (i, child) in ranks.iter_mut().enumerate() {
                if status[i].is_none() {
                    status[i] = child.try_wait().ok().flatten();
                }
            }
            let failed = status.iter().flatten().any(|s| !s.success());
            if status.iter().all(Option::is_some) || failed || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for (i, child) in ranks.iter_mut().enumerate() {
            if status[i].is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        readers
            .into_iter()
            .zip(status)
            .map(|(r, s)| {
                (
                    s,
                    r.map(|h| h.join().unwrap_or_default()).unwrap_or_default(),
                )
            })
            .collect()
    }
}

impl Drop for TestBed {
    fn drop(&mut self) {
        for child in &mut self.ranks {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in self.made.iter().rev() {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}
