//! Throughput of the network transport over loopback, two processes: the
//! TCP connection with two proxy threads per connection against the
//! NetConnection moved by the process's one network proxy (Socket
//! provider).
//!
//! Each rank sends `size` bytes to the other while receiving as many, in
//! slot-sized pieces (8 slots of 512 KiB, the default NCCL_BUFFSIZE), and
//! starts the next transfer once the whole previous one arrived. Rounds of
//! both transports alternate; the medians are printed in MB/s (per
//! direction) and microseconds per transfer, with the median of the
//! rounds' speed ratios (net/tcp, above 1: the proxy is faster).
//!
//! ```text
//! cargo run --release -p rccl-transports --example net_throughput [rounds]
//! ```

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rccl_transports::network::socket::{Socket, SocketDevice};
use rccl_transports::network::{ListenHandle, Net, NetConnection};
use rccl_transports::socket::Secret;
use rccl_transports::tcp::TcpConnection;
use rccl_transports::wait::Backoff;
use rccl_transports::{Connection, Protocol, Tag};

const SLOTS: usize = 8;
const SLOT_BYTES: usize = 512 << 10;
const SIZES: [usize; 6] = [8, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
/// Bytes each run moves per direction (at least one transfer, at most
/// `MAX_ITERS`).
const BYTES_PER_RUN: usize = 128 << 20;
const MAX_ITERS: usize = 20_000;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Sends `size` bytes and receives as many, `iters` times.
fn exchange(conn: &dyn Connection, size: usize, iters: usize) {
    let send = conn.send_fifo(Protocol::Simple);
    let recv = conn.recv_fifo(Protocol::Simple);
    let pieces = size.div_ceil(SLOT_BYTES);
    let never = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    for _ in 0..iters {
        let (mut sent, mut got) = (0, 0);
        let mut backoff = Backoff::with_max_park(Duration::from_millis(1));
        while sent < pieces || got < pieces {
            let mut moved = false;
            if sent < pieces && send.try_reserve().is_some() {
                let len = SLOT_BYTES.min(size - sent * SLOT_BYTES);
                send.publish(len, Tag::default());
                sent += 1;
                moved = true;
            }
            if got < pieces && recv.try_peek().is_some() {
                recv.release();
                got += 1;
                moved = true;
            }
            assert!(conn.failure().is_none(), "{:?}", conn.failure());
            if moved {
                backoff.reset();
            } else {
                let park = if got < pieces {
                    recv.consumer_park()
                } else {
                    send.producer_park()
                };
                backoff
                    .snooze(Some(park), deadline, &never)
                    .expect("the exchange timed out");
            }
        }
    }
}

/// A NetConnection to the peer: this side listens and sends its handle,
/// reads the peer's, and both connect and accept without blocking.
fn net_connection(
    net: Arc<Socket>,
    tell: &mut dyn FnMut(&str),
    hear: &mut dyn FnMut() -> String,
) -> NetConnection {
    let (handle, mut listen) = net.listen(0).unwrap();
    tell(&hex(handle.as_bytes()));
    let theirs = ListenHandle::from_bytes(&unhex(&hear())).unwrap();
    let mut stage = Default::default();
    let (mut send, mut recv) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(10);
    while send.is_none() || recv.is_none() {
        assert!(Instant::now() < deadline, "connecting timed out");
        if send.is_none() {
            send = net.connect(0, &theirs, &mut stage).unwrap();
        }
        if recv.is_none() {
            recv = net.accept(&mut listen).unwrap();
        }
        std::thread::yield_now();
    }
    net.close_listen(listen).unwrap();
    NetConnection::start(net, send.unwrap(), recv.unwrap(), SLOTS, SLOT_BYTES).unwrap()
}

fn socket(secret: Secret) -> Arc<Socket> {
    Arc::new(Socket::new(vec![SocketDevice::loopback()], secret).unwrap())
}

fn iters_for(size: usize) -> usize {
    (BYTES_PER_RUN / size).clamp(1, MAX_ITERS)
}

/// The peer process: answers the parent's commands on stdin.
fn peer() {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut next = || lines.next().expect("a command").expect("stdin");
    let mut out = std::io::stdout();
    let mut tell = |text: &str| {
        writeln!(out, "{text}").unwrap();
        out.flush().unwrap();
    };
    let port: u16 = next().parse().unwrap();
    let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).unwrap();
    let tcp = TcpConnection::start(stream, SLOTS, SLOT_BYTES).unwrap();
    let secret = Secret(unhex(&next()).try_into().unwrap());
    let mut hear = || next();
    let net = net_connection(socket(secret), &mut tell, &mut hear);
    loop {
        let command = next();
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["run", which, size] => {
                let size: usize = size.parse().unwrap();
                let conn: &dyn Connection = if *which == "tcp" { &tcp } else { &net };
                exchange(conn, size, iters_for(size));
                tell("done");
            }
            ["quit"] => return,
            other => panic!("unknown command {other:?}"),
        }
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--peer") {
        peer();
        return;
    }
    let rounds: usize = std::env::args()
        .nth(1)
        .map_or(5, |r| r.parse().expect("rounds"));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .arg("--peer")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_child = child.stdin.take().unwrap();
    let mut from_child = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut tell = |text: &str| {
        writeln!(to_child, "{text}").unwrap();
        to_child.flush().unwrap();
    };
    let mut hear = || {
        from_child
            .next()
            .expect("a reply")
            .expect("the peer's stdout")
    };

    let listener = TcpListener::bind((IpAddr::V4(Ipv4Addr::LOCALHOST), 0)).unwrap();
    tell(&listener.local_addr().unwrap().port().to_string());
    let (stream, _) = listener.accept().unwrap();
    let tcp = TcpConnection::start(stream, SLOTS, SLOT_BYTES).unwrap();
    let secret = Secret::random();
    tell(&hex(&secret.0));
    let net = net_connection(socket(secret), &mut tell, &mut hear);

    println!(
        "# loopback, 2 processes, {SLOTS} slots of {} KiB, {rounds} rounds, medians; MB/s per direction",
        SLOT_BYTES >> 10
    );
    println!(
        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>8}",
        "bytes", "tcp MB/s", "net MB/s", "tcp us", "net us", "net/tcp"
    );
    for size in SIZES {
        let iters = iters_for(size);
        let mut secs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        for round in 0..rounds {
            // Alternate which goes first, so neither always runs warm.
            let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
            for which in order {
                let (name, conn): (&str, &dyn Connection) = if which == 0 {
                    ("tcp", &tcp)
                } else {
                    ("net", &net)
                };
                tell(&format!("run {name} {size}"));
                let t = Instant::now();
                exchange(conn, size, iters);
                assert_eq!(hear(), "done");
                secs[which].push(t.elapsed().as_secs_f64() / iters as f64);
            }
        }
        // Each round's two runs ran side by side: the median of their
        // ratios cancels the machine's drift between rounds.
        let ratio = median(secs[0].iter().zip(&secs[1]).map(|(t, n)| t / n).collect());
        let [tcp_secs, net_secs] = secs.map(median);
        println!(
            "{size:>10} {:>10.0} {:>10.0} {:>10.1} {:>10.1} {:>8.2}",
            size as f64 / tcp_secs / 1e6,
            size as f64 / net_secs / 1e6,
            tcp_secs * 1e6,
            net_secs * 1e6,
            ratio
        );
    }
    tell("quit");
    child.wait().unwrap();
}
