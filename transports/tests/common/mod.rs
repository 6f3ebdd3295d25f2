//! Helpers shared by the network tests: connecting communicators of any
//! [`Net`] without blocking, and pairs of [`NetConnection`]s.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rccl_transports::network::ib::model::Model;
use rccl_transports::network::ib::{Ib, IbConfig};
use rccl_transports::network::socket::{Socket, SocketDevice};
use rccl_transports::network::{Net, NetConnection};
use rccl_transports::socket::Secret;

/// Longest any step of a test may wait.
pub const DEADLINE: Duration = Duration::from_secs(10);

/// Two Socket contexts of one communicator (same secret) on loopback.
pub fn socket_pair() -> (Arc<Socket>, Arc<Socket>) {
    let secret = Secret::random();
    (socket(secret), socket(secret))
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
    let (a_to_b, b_from_a) = connect(&*a, &*b);
    let (b_to_a, a_from_b) = connect(&*b, &*a);
    (
        NetConnection::start(a, a_to_b, a_from_b, nslots, slot_bytes).unwrap(),
        NetConnection::start(b, b_to_a, b_from_a, nslots, slot_bytes).unwrap(),
    )
}
