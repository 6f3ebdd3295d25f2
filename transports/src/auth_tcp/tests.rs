//! The handshake both ways, refusals, floods and shedding, deadlines,
//! and frames.

use super::*;
use proptest::prelude::*;
use std::io::Cursor;
use std::net::{IpAddr, Ipv4Addr};
use std::thread;

fn loopback() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}

fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

fn listener(secret: Secret) -> AuthListener {
    let mut l = AuthListener::bind(loopback(), secret).unwrap();
    l.set_handshake_timeout(Duration::from_millis(200));
    l
}

/// A good client connects and exchanges a frame both ways.
fn good_client(addr: SocketAddr, secret: Secret, hello: &'static [u8]) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut s = connect(addr, &secret, hello, soon(5000)).unwrap();
        write_frame(&mut s, b"ping").unwrap();
        assert_eq!(read_frame(&mut s, 16).unwrap(), b"pong");
    })
}

fn serve_good(l: &mut AuthListener, hello: &[u8]) {
    let stop = AtomicBool::new(false);
    let (mut s, got) = l.accept(soon(5000), &stop).unwrap();
    assert_eq!(got, hello);
    assert!(s.tcp().nodelay().unwrap());
    assert_eq!(read_frame(&mut s, 16).unwrap(), b"ping");
    write_frame(&mut s, b"pong").unwrap();
}

#[test]
fn secret_debug_hides_bytes() {
    let s = Secret([0xab; 32]);
    let d = format!("{s:?}");
    assert!(!d.contains("ab") && !d.contains("171"), "{d}");
    assert_ne!(Secret::random(), Secret::random());
}

#[test]
fn connect_with_hello() {
    let secret = Secret::random();
    let mut l = listener(secret);
    let c = good_client(l.local_addr(), secret, b"hello there");
    serve_good(&mut l, b"hello there");
    c.join().unwrap();
}

#[test]
fn empty_and_max_hello() {
    let secret = Secret::random();
    let mut l = listener(secret);
    let c = good_client(l.local_addr(), secret, b"");
    serve_good(&mut l, b"");
    c.join().unwrap();
    let big: &'static [u8] = Box::leak(vec![7u8; MAX_HELLO].into_boxed_slice());
    let c = good_client(l.local_addr(), secret, big);
    serve_good(&mut l, big);
    c.join().unwrap();
    let e = connect(l.local_addr(), &secret, &[0; MAX_HELLO + 1], soon(100)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn wrong_secret_refused_then_good_client_accepted() {
    let secret = Secret::random();
    let mut l = listener(secret);
    let addr = l.local_addr();
    let bad = thread::spawn(move || {
        let t = Instant::now();
        (
            connect(addr, &Secret::random(), b"x", soon(5000)),
            t.elapsed(),
        )
    });
    let stop = AtomicBool::new(false);
    // Only the bad client is there: nothing is accepted.
    let e = l.accept(soon(500), &stop).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    let (e, took) = bad.join().unwrap();
    let e = e.unwrap_err();
    // Refused outright: not taken for a shed handshake and retried.
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("refused"), "{e}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    let c = good_client(addr, secret, b"good");
    serve_good(&mut l, b"good");
    c.join().unwrap();
}

#[test]
fn client_refuses_listener_with_other_secret() {
    // The client must not accept a listener that cannot prove the secret,
    // even if that listener skips verification: emulate one by hand.
    let raw = TcpListener::bind(loopback()).unwrap();
    let addr = raw.local_addr().unwrap();
    let server = thread::spawn(move || {
        let (mut s, _) = raw.accept().unwrap();
        let mut g = [0u8; GREETING_LEN];
        g[..8].copy_from_slice(&MAGIC);
        g[8..12].copy_from_slice(&VERSION.to_le_bytes());
        s.write_all(&g).unwrap();
        let mut r = [0u8; RESPONSE_LEN];
        s.read_exact(&mut r).unwrap();
        s.write_all(&[0u8; MAC_LEN]).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        rest
    });
    let e = connect(addr, &Secret::random(), b"secret hello", soon(5000)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    // The hello never reached the impostor.
    assert!(server.join().unwrap().is_empty());
}

#[test]
fn garbage_truncated_and_silent_clients_refused() {
    let secret = Secret::random();
    let mut l = listener(secret);
    let addr = l.local_addr();
    // Garbage.
    let mut garbage = TcpStream::connect(addr).unwrap();
    garbage.write_all(&[0x55; 200]).unwrap();
    // Truncated: a valid header, then the connection ends.
    let mut truncated = TcpStream::connect(addr).unwrap();
    let mut partial = MAGIC.to_vec();
    partial.extend_from_slice(&VERSION.to_le_bytes());
    partial.extend_from_slice(&[1; 10]);
    truncated.write_all(&partial).unwrap();
    truncated.shutdown(Shutdown::Write).unwrap();
    // Silent: connects and sends nothing.
    let silent = TcpStream::connect(addr).unwrap();
    // Wrong protocol version.
    let mut version = TcpStream::connect(addr).unwrap();
    let mut v = MAGIC.to_vec();
    v.extend_from_slice(&99u32.to_le_bytes());
    v.resize(RESPONSE_LEN, 0);
    version.write_all(&v).unwrap();
    let c = good_client(addr, secret, b"after the bad ones");
    let t = Instant::now();
    serve_good(&mut l, b"after the bad ones");
    // One silent client costs at most one handshake timeout.
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    c.join().unwrap();
    drop((garbage, truncated, silent, version));
}

#[test]
fn silent_clients_do_not_delay_a_real_one() {
    let secret = Secret::random();
    let mut l = listener(secret);
    l.set_handshake_timeout(Duration::from_secs(1));
    let addr = l.local_addr();
    let silent: Vec<TcpStream> = (0..60).map(|_| TcpStream::connect(addr).unwrap()).collect();
    let c = good_client(addr, secret, b"among the silent");
    let t = Instant::now();
    serve_good(&mut l, b"among the silent");
    // One at a time, the silent ones would cost 60 handshake timeouts.
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    c.join().unwrap();
    drop(silent);
}

#[test]
fn poll_timeout_never_exceeds_the_limit_given() {
    let mut l = listener(Secret::random());
    l.set_handshake_timeout(Duration::from_secs(30));
    let silent = TcpStream::connect(l.local_addr()).unwrap();
    while l.pending.is_empty() {
        l.progress().unwrap();
    }
    // What another listener's expired deadline leaves of a poll.
    assert_eq!(l.poll_timeout(Duration::ZERO), Duration::ZERO);
    assert_eq!(
        l.poll_timeout(Duration::from_millis(5)),
        Duration::from_millis(5)
    );
    let waits = l.poll_timeout(Duration::from_secs(60));
    assert!(
        waits > Duration::from_secs(25) && waits <= Duration::from_secs(30),
        "{waits:?}"
    );
    drop(silent);
}

#[test]
fn a_flood_from_one_source_is_capped_and_sheds_the_oldest() {
    let secret = Secret::random();
    let mut l = listener(secret);
    l.set_handshake_timeout(Duration::from_secs(30));
    let addr = l.local_addr();
    let flood = MAX_PENDING_PER_SOURCE + 20;
    let silent: Vec<TcpStream> = (0..flood)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    let deadline = soon(5000);
    while l.pending.len() + (l.refusals().shed as usize) < flood && Instant::now() < deadline {
        l.progress().unwrap();
        thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(l.pending.len(), MAX_PENDING_PER_SOURCE);
    assert_eq!(l.refusals().shed as usize, flood - MAX_PENDING_PER_SOURCE);
    // The oldest went: the first client sees its connection closed.
    let mut first = &silent[0];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut greeting = [0u8; GREETING_LEN];
    first.read_exact(&mut greeting).unwrap();
    assert_eq!(first.read(&mut [0u8; 1]).unwrap(), 0);
    // The newest is still held, and a real client gets through.
    assert_eq!(
        l.pending.last().unwrap().peer,
        silent[flood - 1].local_addr().unwrap()
    );
    let c = good_client(addr, secret, b"after the flood");
    serve_good(&mut l, b"after the flood");
    c.join().unwrap();
}

#[test]
fn a_client_whose_handshake_was_shed_tries_again() {
    // A listener that greets, takes the response, then drops the
    // connection (as a busy one sheds it), and comes back properly.
    let raw = TcpListener::bind(loopback()).unwrap();
    let addr = raw.local_addr().unwrap();
    let secret = Secret::random();
    let server = thread::spawn(move || {
        let (mut s, _) = raw.accept().unwrap();
        let mut g = [0u8; GREETING_LEN];
        g[..8].copy_from_slice(&MAGIC);
        g[8..12].copy_from_slice(&VERSION.to_le_bytes());
        s.write_all(&g).unwrap();
        let mut r = [0u8; RESPONSE_LEN];
        s.read_exact(&mut r).unwrap();
        drop((s, raw));
        let mut l = AuthListener::bind(addr, secret).unwrap();
        serve_good(&mut l, b"second try");
    });
    let mut s = connect(addr, &secret, b"second try", soon(5000)).unwrap();
    write_frame(&mut s, b"ping").unwrap();
    assert_eq!(read_frame(&mut s, 16).unwrap(), b"pong");
    server.join().unwrap();
}

#[test]
fn accept_times_out_and_stops() {
    let mut l = listener(Secret::random());
    let stop = AtomicBool::new(false);
    let t = Instant::now();
    let e = l.accept(soon(100), &stop).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    assert!(t.elapsed() >= Duration::from_millis(100));
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let setter = thread::spawn(move || {
        thread::sleep(Duration::from_millis(100));
        s2.store(true, Ordering::Relaxed);
    });
    let t = Instant::now();
    let e = l.accept(soon(10_000), &stop).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Interrupted);
    assert!(t.elapsed() < Duration::from_secs(1));
    setter.join().unwrap();
}

#[test]
fn connect_retries_until_listener_appears() {
    // Reserve a port, free it, and bind it again a little later.
    let port = TcpListener::bind(loopback())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let secret = Secret::random();
    let server = thread::spawn(move || {
        thread::sleep(Duration::from_millis(150));
        let mut l = AuthListener::bind(addr, secret).unwrap();
        serve_good(&mut l, b"late");
    });
    let mut s = connect(addr, &secret, b"late", soon(5000)).unwrap();
    write_frame(&mut s, b"ping").unwrap();
    assert_eq!(read_frame(&mut s, 16).unwrap(), b"pong");
    server.join().unwrap();
    // Nobody listening: TimedOut at the deadline.
    drop(s);
    let port = TcpListener::bind(loopback())
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port);
    let e = connect(addr, &secret, b"", soon(100)).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::TimedOut | io::ErrorKind::ConnectionRefused
        ),
        "{e}"
    );
}

#[test]
fn frames_round_trip_and_limits() {
    let mut buf = Vec::new();
    write_frame(&mut buf, b"abc").unwrap();
    write_frame(&mut buf, b"").unwrap();
    let big = vec![9u8; 3 << 20];
    write_frame(&mut buf, &big).unwrap();
    let mut r = Cursor::new(buf);
    assert_eq!(read_frame(&mut r, 8).unwrap(), b"abc");
    assert_eq!(read_frame(&mut r, 0).unwrap(), b"");
    assert_eq!(read_frame(&mut r, 4 << 20).unwrap(), big);
    let e = read_frame(&mut r, 8).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    // A huge announced length is refused before any allocation.
    let mut r = Cursor::new(u32::MAX.to_le_bytes().to_vec());
    let e = read_frame(&mut r, 1024).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    // A truncated payload is an error, not a short frame.
    let mut r = Cursor::new([5, 0, 0, 0, 1, 2].to_vec());
    assert_eq!(
        read_frame(&mut r, 1024).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn read_frame_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64), max in 0usize..32) {
        let mut r = Cursor::new(bytes.clone());
        match read_frame(&mut r, max) {
            Ok(p) => {
                prop_assert!(p.len() <= max);
                prop_assert_eq!(&p[..], &bytes[4..4 + p.len()]);
            }
            Err(e) => prop_assert!(matches!(
                e.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof
            )),
        }
    }

    #[test]
    fn server_handshake_rejects_arbitrary_bytes(
        valid_header in any::<bool>(),
        bytes in proptest::collection::vec(any::<u8>(), 0..160),
    ) {
        let mut l = listener(Secret::random());
        let mut c = TcpStream::connect(l.local_addr()).unwrap();
        let mut msg = Vec::new();
        if valid_header {
            msg.extend_from_slice(&MAGIC);
            msg.extend_from_slice(&VERSION.to_le_bytes());
        }
        msg.extend_from_slice(&bytes);
        c.write_all(&msg).unwrap();
        c.shutdown(Shutdown::Write).unwrap();
        wait_readable(&[l.as_raw_fd()], Duration::from_secs(2)).unwrap();
        prop_assert!(l.accept_pending().unwrap().is_none());
    }
}
