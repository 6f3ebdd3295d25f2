//! The TCP socket transport's setup half: a listener per communicator that
//! accepts authenticated data connections, and the dialing side.
//!
//! Of each pair of ranks the lower one dials and the higher one accepts, on
//! every channel, so both sides agree on one socket per (peer, channel)
//! without talking first. Dialing never waits for the peer to be ready (its
//! accept thread answers), so one thread can set up connections for several
//! communicators at once: dial everything first, then collect what others
//! dialed.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::socket::{self, AuthListener, Refusals, Secret};

const HELLO_MAGIC: u32 = 0x7263_6364; // "rccd": a data connection

/// Streams accepted and authenticated, waiting to be claimed, what the
/// listener turned away (for reports on a peer that did not connect), and
/// why it stopped accepting, if it did.
#[derive(Default)]
struct Accepted {
    streams: Mutex<Arrivals>,
    arrived: Condvar,
}

#[derive(Default)]
struct Arrivals {
    streams: HashMap<(usize, usize), TcpStream>,
    refusals: Refusals,
    failure: Option<String>,
}

/// One communicator's TCP endpoint.
pub struct TcpTransport {
    rank: usize,
    secret: Secret,
    local_addr: SocketAddr,
    accepted: Arc<Accepted>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TcpTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpTransport")
            .field("rank", &self.rank)
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

impl TcpTransport {
    /// Listens on `ip` (any port) for data connections of rank `rank`'s
    /// communicator, authenticated with `secret`.
    pub fn listen(ip: IpAddr, rank: usize, secret: Secret) -> io::Result<TcpTransport> {
        let mut listener = AuthListener::bind(SocketAddr::new(ip, 0), secret)?;
        let local_addr = listener.local_addr();
        let accepted = Arc::new(Accepted::default());
        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let (accepted, stop) = (accepted.clone(), stop.clone());
            std::thread::Builder::new()
                .name("rccl-tcp-accept".into())
                .spawn(move || accept_loop(&mut listener, &accepted, &stop))?
        };
        Ok(TcpTransport {
            rank,
            secret,
            local_addr,
            accepted,
            stop,
            acceptor: Some(acceptor),
        })
    }

    /// The address peers dial.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether this rank dials `peer` (the lower rank of a pair dials).
    pub fn dials(&self, peer: usize) -> bool {
        self.rank < peer
    }

    /// Dials `peer`'s listener at `addr` for `channel`.
    pub fn dial(
        &self,
        peer: usize,
        addr: SocketAddr,
        channel: usize,
        deadline: Instant,
    ) -> io::Result<TcpStream> {
        debug_assert!(self.dials(peer));
        let hello = encode_hello(self.rank, channel);
        socket::connect(addr, &self.secret, &hello, deadline)
    }

    /// Waits for `peer` to dial us for `channel`. A timeout names what
    /// the listener turned away meanwhile: strangers that failed the
    /// handshake there may be why `peer` did not get through.
    pub fn accept_from(
        &self,
        peer: usize,
        channel: usize,
        deadline: Instant,
        abort: &AtomicBool,
    ) -> io::Result<TcpStream> {
        let mut arrivals = self.accepted.streams.lock();
        loop {
            if let Some(stream) = arrivals.streams.remove(&(peer, channel)) {
                return Ok(stream);
            }
            if let Some(why) = &arrivals.failure {
                return Err(io::Error::other(format!(
                    "the data listener stopped: {why}"
                )));
            }
            if abort.load(Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "aborted"));
            }
            let now = Instant::now();
            if now >= deadline {
                let refusals = &arrivals.refusals;
                let why = if refusals.failed + refusals.shed == 0 {
                    format!("rank {peer} did not connect for channel {channel}")
                } else {
                    format!(
                        "no connection from rank {peer} for channel {channel} reached the data listener at {} (it turned away {refusals})",
                        self.local_addr
                    )
                };
                return Err(io::Error::new(io::ErrorKind::TimedOut, why));
            }
            let step = (deadline - now).min(Duration::from_millis(20));
            self.accepted.arrived.wait_for(&mut arrivals, step);
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn encode_hello(rank: usize, channel: usize) -> Vec<u8> {
    let mut hello = Vec::with_capacity(12);
    hello.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    hello.extend_from_slice(&(rank as u32).to_le_bytes());
    hello.extend_from_slice(&(channel as u32).to_le_bytes());
    hello
}

fn decode_hello(hello: &[u8]) -> Option<(usize, usize)> {
    let word = |i: usize| -> Option<u32> {
        Some(u32::from_le_bytes(
            hello.get(i * 4..i * 4 + 4)?.try_into().ok()?,
        ))
    };
    if hello.len() != 12 || word(0)? != HELLO_MAGIC {
        return None;
    }
    Some((word(1)? as usize, word(2)? as usize))
}

fn accept_loop(listener: &mut AuthListener, accepted: &Accepted, stop: &AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        // Short waits, so that the refusal counts stay current.
        let got = listener.accept(Instant::now() + Duration::from_millis(100), stop);
        let mut arrivals = accepted.streams.lock();
        arrivals.refusals.clone_from(listener.refusals());
        match got {
            Ok((stream, hello)) => match decode_hello(&hello) {
                Some(key) => {
                    arrivals.streams.insert(key, stream);
                    accepted.arrived.notify_all();
                }
                None => tracing::warn!(
                    "refused a data connection from {:?}: malformed hello",
                    stream.peer_addr().ok()
                ),
            },
            Err(err) if err.kind() == io::ErrorKind::Interrupted => return,
            Err(err) if err.kind() == io::ErrorKind::TimedOut => {}
            // Accepting failed (e.g. out of file descriptors) and would fail
            // again at once: stop, so that waits for connections fail now
            // with the reason and dialers find the listener closed.
            Err(err) => {
                tracing::warn!("data listener: {err}");
                arrivals.failure = Some(err.to_string());
                accepted.arrived.notify_all();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn lower_rank_dials_higher_rank_accepts_per_channel() {
        let secret = Secret::random();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let low = TcpTransport::listen(ip, 0, secret).unwrap();
        let high = TcpTransport::listen(ip, 1, secret).unwrap();
        assert!(low.dials(1) && !high.dials(0));
        let deadline = Instant::now() + Duration::from_secs(10);
        let abort = AtomicBool::new(false);
        let _c1 = low.dial(1, high.local_addr(), 1, deadline).unwrap();
        let _c0 = low.dial(1, high.local_addr(), 0, deadline).unwrap();
        high.accept_from(0, 0, deadline, &abort).unwrap();
        high.accept_from(0, 1, deadline, &abort).unwrap();
        let soon = Instant::now() + Duration::from_millis(50);
        let err = high.accept_from(0, 2, soon, &abort).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[test]
    fn hello_round_trips_and_rejects_garbage() {
        assert_eq!(decode_hello(&encode_hello(5, 3)), Some((5, 3)));
        assert_eq!(decode_hello(b"garbage"), None);
        assert_eq!(decode_hello(&[0; 12]), None);
    }

    #[test]
    fn intruders_at_the_data_listener_do_not_disturb_connections() {
        use std::io::Write;
        let secret = Secret::random();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let low = TcpTransport::listen(ip, 0, secret).unwrap();
        let high = TcpTransport::listen(ip, 1, secret).unwrap();
        let addr = high.local_addr();
        let deadline = Instant::now() + Duration::from_secs(10);
        // Garbage, a truncated handshake, a wrong secret, and a client with
        // the right secret but a malformed hello.
        let mut garbage = std::net::TcpStream::connect(addr).unwrap();
        let _ = garbage.write_all(b"GET / HTTP/1.0\r\n\r\n and more garbage than a handshake");
        let mut truncated = std::net::TcpStream::connect(addr).unwrap();
        let _ = truncated.write_all(b"RCCLAUTH");
        drop(truncated);
        let wrong = crate::socket::connect(addr, &Secret::random(), &encode_hello(0, 0), deadline);
        assert_eq!(wrong.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        let _bad_hello = crate::socket::connect(addr, &secret, b"not a hello", deadline).unwrap();
        let abort = AtomicBool::new(false);
        let _c = low.dial(1, addr, 0, deadline).unwrap();
        high.accept_from(0, 0, deadline, &abort).unwrap();
        drop(garbage);
    }

    #[test]
    fn silent_clients_at_the_data_listener_do_not_delay_a_rank() {
        let secret = Secret::random();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let low = TcpTransport::listen(ip, 0, secret).unwrap();
        let high = TcpTransport::listen(ip, 1, secret).unwrap();
        let addr = high.local_addr();
        let silent: Vec<_> = (0..20)
            .map(|_| std::net::TcpStream::connect(addr).unwrap())
            .collect();
        let t = Instant::now();
        // One at a time, 20 silent clients held the listener 100 s.
        let deadline = t + Duration::from_secs(2);
        let abort = AtomicBool::new(false);
        let _c = low.dial(1, addr, 0, deadline).unwrap();
        high.accept_from(0, 0, deadline, &abort).unwrap();
        eprintln!(
            "data connection beside 20 silent clients: {:?}",
            t.elapsed()
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        drop(silent);
    }

    #[test]
    fn a_peer_that_does_not_connect_is_reported_with_what_the_listener_turned_away() {
        let secret = Secret::random();
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let high = TcpTransport::listen(ip, 1, secret).unwrap();
        let abort = AtomicBool::new(false);
        let soon = || Instant::now() + Duration::from_millis(300);
        let err = high.accept_from(0, 0, soon(), &abort).unwrap_err();
        assert_eq!(err.to_string(), "rank 0 did not connect for channel 0");
        let wrong = crate::socket::connect(
            high.local_addr(),
            &Secret::random(),
            &encode_hello(0, 0),
            soon(),
        );
        assert_eq!(wrong.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        let err = high.accept_from(0, 0, soon(), &abort).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("no connection from rank 0 for channel 0 reached")
                && msg.contains("turned away 1 connection(s) that failed the handshake")
                && msg.contains("wrong secret"),
            "{msg}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn hellos_decode_or_refuse(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..20)) {
            if let Some((rank, channel)) = decode_hello(&bytes) {
                proptest::prop_assert_eq!(encode_hello(rank, channel), bytes);
            }
        }
    }
}
