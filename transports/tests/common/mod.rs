//! Helpers shared by the network tests: connecting communicators of any
//! [`Net`] without blocking, and pairs of [`NetConnection`]s.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rccl_transports::auth_tcp::Secret;
use rccl_transports::network::{Ib, IbConfig};
use rccl_transports::network::{Net, NetConnection};
use rccl_transports::network::{Plugin, PluginNet};
use rccl_transports::network::{Socket, SocketDevice};
use rccl_transports::verbs::Model;

/// Longest any step of a test may wait.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Two Socket contexts of one communicator (same secret) on loopback.
pub fn socket_pair() -> (Arc<Socket>, Arc<Socket>) {
    let secret = Secret::random();
    (socket(secret), socket(secret))
}

/// Two Socket contexts of one communicator whose connections are
/// encrypted with one PSK.
pub fn encrypted_socket_pair() -> (Arc<Socket>, Arc<Socket>) {
    let secret = Secret::random();
    let psk = rccl_transports::auth_tcp::Psk::new(b"conformance-key-of-at-least-32-bytes").unwrap();
    let encrypted = || {
        let mut net = Socket::new(vec![SocketDevice::loopback()], secret).unwrap();
        net.set_psk(Some(psk.clone()));
        Arc::new(net)
    };
    (encrypted(), encrypted())
}

/// A Socket context on loopback with `secret`.
pub fn socket(secret: Secret) -> Arc<Socket> {
    Arc::new(Socket::new(vec![SocketDevice::loopback()], secret).unwrap())
}

/// Two IB contexts of one communicator over the verbs model on loopback,
/// with `qps` queue pairs per connection.
pub fn ib_pair(qps: usize) -> (Arc<Ib>, Arc<Ib>) {
    let secret = Secret::random();
    (ib(secret, qps), ib(secret, qps))
}

/// An IB context over the verbs model on loopback with `secret`.
pub fn ib(secret: Secret, qps: usize) -> Arc<Ib> {
    ib_on(
        std::net::Ipv4Addr::LOCALHOST,
        secret,
        IbConfig {
            qps_per_connection: qps,
            ..IbConfig::default()
        },
    )
}

/// An IB context over the verbs model's NIC on `ip` (a NIC per address
/// and process: tests that inject faults use their own).
pub fn ib_on(ip: std::net::Ipv4Addr, secret: Secret, config: IbConfig) -> Arc<Ib> {
    let model = Arc::new(Model::new(ip).unwrap());
    Arc::new(Ib::new(model, config, ip.into(), secret).unwrap())
}

/// Calls `step` until it returns `Some`, failing the test at the deadline.
pub fn until<T>(what: &str, mut step: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Some(value) = step() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// A communicator from `from` to `to`: `to` listens, `from` connects, and
/// both are driven from this thread, alternately, until both are done.
pub fn connect<N: Net>(from: &N, to: &N) -> (N::SendComm, N::RecvComm) {
    let (handle, mut listen) = to.listen(0).unwrap();
    let mut stage = N::ConnectStage::default();
    let (mut send, mut recv) = (None, None);
    until("a connection", || {
        if send.is_none() {
            send = from.connect(0, &handle, &mut stage).unwrap();
        }
        if recv.is_none() {
            recv = to.accept(&mut listen).unwrap();
        }
        (send.is_some() && recv.is_some()).then_some(())
    });
    to.close_listen(listen).unwrap();
    (send.unwrap(), recv.unwrap())
}

/// Two connected [`NetConnection`]s (one per rank) with FIFOs of `nslots`
/// slots of `slot_bytes`.
pub fn net_connection_pair(nslots: usize, slot_bytes: usize) -> (NetConnection, NetConnection) {
    let (a, b) = socket_pair();
    net_connection_pair_over(a, b, nslots, slot_bytes)
}

/// As [`net_connection_pair`], over the contexts `a` and `b` of any
/// provider.
pub fn net_connection_pair_over<N: Net>(
    a: Arc<N>,
    b: Arc<N>,
    nslots: usize,
    slot_bytes: usize,
) -> (NetConnection, NetConnection) {
    let (a_to_b, b_from_a) = connect(&*a, &*b);
    let (b_to_a, a_from_b) = connect(&*b, &*a);
    (
        NetConnection::start(a, a_to_b, a_from_b, nslots, slot_bytes).unwrap(),
        NetConnection::start(b, b_to_a, b_from_a, nslots, slot_bytes).unwrap(),
    )
}

/// libnccl-net-rcclrs (cargo names it libnccl_net_rcclrs.so), built as a
/// dev-dependency next to the test binary.
pub fn exported_plugin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|dir| dir.join("libnccl_net_rcclrs.so"))
        .find(|path| path.exists())
        .expect("libnccl_net_rcclrs.so next to the test binary")
}

/// Runs `body` on a copy of libnccl-net-rcclrs of its own (named after
/// `copy`, made once per process) with the environment `settings` set, for
/// what the plug-in reads at `init`. The plug-in runs one network per
/// loaded library, hence the copies; the settings are set only while
/// `body` runs, under a lock that every such call takes.
pub fn with_exported_plugin<T>(
    copy: &str,
    settings: &[(&str, &str)],
    body: impl FnOnce(&Path) -> T,
) -> T {
    static COPIED: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut copied = COPIED.lock().unwrap_or_else(|e| e.into_inner());
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("libnccl-net-rcclrs-{copy}.so"));
    if !copied.iter().any(|done| done == copy) {
        // Renamed into place, never written over: another test process may
        // have the previous copy mapped.
        let partial = path.with_extension(format!("so.{}", std::process::id()));
        std::fs::copy(exported_plugin(), &partial).unwrap();
        std::fs::rename(&partial, &path).unwrap();
        copied.push(copy.to_string());
    }
    for (name, value) in settings {
        std::env::set_var(name, value);
    }
    let out = body(&path);
    for (name, _) in settings {
        std::env::remove_var(name);
    }
    out
}

/// Two contexts of libnccl-net-rcclrs running the network `p2p` names
/// (`NCCL_PLUGIN_P2P`: `socket`, or `ib` over the verbs model), loaded at
/// the newest interface version it exports up to `newest`.
pub fn exported_plugin_pair(p2p: &str, newest: u32) -> (Arc<PluginNet>, Arc<PluginNet>) {
    let model = p2p == "ib";
    let mut settings = vec![("NCCL_PLUGIN_P2P", p2p)];
    if model {
        settings.push(("RCCL_IB_MODEL", "1"));
    }
    let pair = with_exported_plugin(p2p, &settings, |path| plugin_pair(path, newest));
    // The device says which network runs: the model's NIC, or an address.
    let device = pair.0.properties(0).unwrap().name;
    assert_eq!(
        device.starts_with("rccl_model"),
        model,
        "NCCL_PLUGIN_P2P={p2p}: device {device}"
    );
    pair
}

/// The C plug-in of tests/c/loopback_net.c, compiled once with `cc`.
pub fn c_plugin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| compile_c_plugin("libnccl-net-loopback.so", &[]))
        .clone()
}

/// The C plug-in built so that its `init` fails (`LOOPBACK_FAIL_INIT`).
pub fn failing_c_plugin() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| compile_c_plugin("libnccl-net-failing.so", &["-DLOOPBACK_FAIL_INIT"]))
        .clone()
}

fn compile_c_plugin(name: &str, defines: &[&str]) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/loopback_net.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    // Built aside and renamed into place: another test process may be
    // loading the previous build.
    let partial = out.with_extension(format!("so.{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror"])
        .args(defines)
        .arg("-o")
        .arg(&partial)
        .arg(&source)
        .status()
        .expect("running cc");
    assert!(status.success(), "{cc} failed on {}", source.display());
    std::fs::rename(&partial, &out).unwrap();
    out
}

/// Two contexts of one communicator from the plug-in at `path`, loaded at
/// the newest interface version it exports up to `newest`.
pub fn plugin_pair(path: &Path, newest: u32) -> (Arc<PluginNet>, Arc<PluginNet>) {
    let entry = path.to_str().unwrap();
    let plugin = Plugin::load_version(Some(entry), newest).unwrap();
    assert!(plugin.version() <= newest);
    let comm_id = u64::from_le_bytes(Secret::random().0[..8].try_into().unwrap());
    (
        Arc::new(plugin.open(comm_id).unwrap()),
        Arc::new(plugin.open(comm_id).unwrap()),
    )
}

/// Bytes as hexadecimal text, to hand a listen handle to a child process.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of [`hex`]'s text.
pub fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}
