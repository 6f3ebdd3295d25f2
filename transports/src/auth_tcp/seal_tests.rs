//! Encrypted connections: data both ways, refusals of another key or of
//! plaintext, what crosses the wire (through a recording relay), and
//! tampering.

use super::*;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::thread;

use parking_lot::Mutex;

const HELLO: &[u8] = b"hello-in-the-clear?";

fn key(byte: u8) -> Psk {
    Psk::new(&[byte; MIN_PSK_BYTES]).unwrap()
}

fn loopback() -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0)
}

fn soon(ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(ms)
}

/// A payload no handshake or cipher produces by chance.
fn pattern(len: usize) -> Vec<u8> {
    b"PATTERN-0123456789-"
        .iter()
        .copied()
        .cycle()
        .take(len)
        .collect()
}

/// Relays one connection to `target`, recording what the client sent and
/// flipping its byte at `flip` (if any).
pub(crate) fn relay(target: SocketAddr, flip: Option<usize>) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let front = TcpListener::bind(loopback()).unwrap();
    let addr = front.local_addr().unwrap();
    let wire = Arc::new(Mutex::new(Vec::new()));
    let record = wire.clone();
    thread::spawn(move || {
        let (client, _) = front.accept().unwrap();
        let server = TcpStream::connect(target).unwrap();
        let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let back = thread::spawn(move || {
            let (mut s_in, mut c_out) = (server, client);
            let _ = io::copy(&mut s_in, &mut c_out);
            let _ = c_out.shutdown(Shutdown::Write);
        });
        let mut buf = [0u8; 4096];
        while let Ok(n) = c_in.read(&mut buf) {
            if n == 0 {
                break;
            }
            let mut wire = record.lock();
            let at = wire.len();
            if let Some(i) = flip.filter(|i| (at..at + n).contains(i)) {
                buf[i - at] ^= 0x01;
            }
            wire.extend_from_slice(&buf[..n]);
            drop(wire);
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
        let _ = back.join();
    });
    (addr, wire)
}

pub(crate) fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Sends `payload` from a client through a relay to a listener, each
/// with its key; returns what the listener read (or its error) and the
/// client's bytes on the wire.
fn through_relay(
    psk: Option<Psk>,
    payload: &[u8],
    flip: Option<usize>,
) -> (io::Result<Vec<u8>>, Vec<u8>) {
    let secret = Secret::random();
    let mut listener = AuthListener::bind_with(loopback(), secret, psk.clone()).unwrap();
    let (addr, wire) = relay(listener.local_addr(), flip);
    let sent = payload.to_vec();
    let client = thread::spawn(move || {
        let never = AtomicBool::new(false);
        let mut s = connect_with(addr, &secret, psk.as_ref(), HELLO, soon(5000), &never).unwrap();
        s.write_all(&sent).unwrap();
        s
    });
    let (mut s, hello) = listener.accept(soon(5000), &NEVER).unwrap();
    assert_eq!(hello, HELLO);
    let mut got = vec![0u8; payload.len()];
    let read = s.read_exact(&mut got).map(|()| got);
    drop(client.join().unwrap());
    let wire = wire.lock().clone();
    (read, wire)
}

#[test]
fn encrypted_data_crosses_intact_both_ways() {
    let secret = Secret::random();
    let mut listener = AuthListener::bind_with(loopback(), secret, Some(key(7))).unwrap();
    let addr = listener.local_addr();
    let payload = pattern(300_000);
    let sent = payload.clone();
    let client = thread::spawn(move || {
        let mut s = connect_with(addr, &secret, Some(&key(7)), HELLO, soon(5000), &NEVER).unwrap();
        assert!(s.encrypted());
        s.write_all(&sent).unwrap();
        let mut echo = vec![0u8; sent.len()];
        s.read_exact(&mut echo).unwrap();
        assert_eq!(echo, sent);
    });
    let (mut s, hello) = listener.accept(soon(5000), &NEVER).unwrap();
    assert!(s.encrypted());
    assert_eq!(hello, HELLO);
    let mut got = vec![0u8; payload.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, payload);
    s.write_all(&got).unwrap();
    client.join().unwrap();
}

/// Another PSK, or the same PSK with another communicator's secret.
#[test]
fn another_key_is_refused_at_once_naming_the_listener() {
    let secret = Secret::random();
    for (client_key, client_secret) in [(key(2), secret), (key(1), Secret::random())] {
        let mut listener = AuthListener::bind_with(loopback(), secret, Some(key(1))).unwrap();
        listener.set_handshake_timeout(Duration::from_millis(500));
        let addr = listener.local_addr();
        let serve = thread::spawn(move || listener.accept(soon(1500), &NEVER).map(|_| ()));
        let start = Instant::now();
        let e = connect_with(
            addr,
            &client_secret,
            Some(&client_key),
            HELLO,
            soon(5000),
            &NEVER,
        )
        .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&addr.to_string()) && text.contains("different encryption key"),
            "{text}"
        );
        // The listener never hands out the connection.
        assert_eq!(
            serve.join().unwrap().unwrap_err().kind(),
            io::ErrorKind::TimedOut
        );
    }
}

#[test]
fn plaintext_and_encrypted_sides_refuse_each_other() {
    let secret = Secret::random();
    for (listener_key, client_key, says) in [
        (None, Some(key(3)), "does not encrypt"),
        (
            Some(key(3)),
            None,
            "encrypts its connections and this process does not",
        ),
    ] {
        let mut listener = AuthListener::bind_with(loopback(), secret, listener_key).unwrap();
        listener.set_handshake_timeout(Duration::from_millis(300));
        let addr = listener.local_addr();
        let serve = thread::spawn(move || listener.accept(soon(800), &NEVER).map(|_| ()));
        let e = connect_with(
            addr,
            &secret,
            client_key.as_ref(),
            HELLO,
            soon(3000),
            &NEVER,
        )
        .unwrap_err();
        assert!(e.to_string().contains(says), "{e}");
        assert!(serve.join().unwrap().is_err());
    }
}

/// The recording relay sees the payload and the handshake in the clear
/// without a key, and neither with one.
#[test]
fn nothing_crosses_in_the_clear_when_encrypted() {
    let payload = pattern(100_000);
    let marker = &payload[..64];
    let (got, wire) = through_relay(None, &payload, None);
    assert_eq!(got.unwrap(), payload);
    assert!(contains(&wire, marker) && contains(&wire, &MAGIC) && contains(&wire, HELLO));

    let (got, wire) = through_relay(Some(key(9)), &payload, None);
    assert_eq!(got.unwrap(), payload);
    assert!(wire.len() > payload.len());
    for (what, needle) in [("payload", marker), ("magic", &MAGIC[..]), ("hello", HELLO)] {
        assert!(!contains(&wire, needle), "the {what} crossed in the clear");
    }
}

#[test]
fn a_flipped_byte_fails_authentication() {
    let payload = pattern(10_000);
    // Past the handshake (48 + 2 + 16 + 2 + 16 + hello bytes), inside the data.
    let (got, _) = through_relay(Some(key(4)), &payload, Some(2_000));
    let e = got.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    assert!(e.to_string().contains("failed authentication"), "{e}");
    // The same relay without a flip delivers it.
    let (got, _) = through_relay(Some(key(4)), &payload, None);
    assert_eq!(got.unwrap(), payload);
}

#[test]
fn short_keys_are_refused() {
    let e = Psk::new(&[1; MIN_PSK_BYTES - 1]).unwrap_err();
    assert!(e.to_string().contains("at least 32"), "{e}");
}
