//! [`NetConnection`]: FIFOs moved by the process's network proxy through a
//! [`Net`] provider (Socket here), with the behaviour of the TCP transport
//! it replaces: order, closing notes, drain on drop, failures that name the
//! peer.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    connect, hex, net_connection_pair, net_connection_pair_over, socket_pair, unhex, until,
    DEADLINE,
};
use rccl_transports::network::{keep_polling, CommRef, MemoryType, Net, NetConnection};
use rccl_transports::wait_until;
use rccl_transports::Connection;
use rccl_transports::{
    control_bytes, fifo_bytes, Fifo, FifoMemory, HeapMemory, Protocol, Tag, SLOT_HEADER,
};

fn tag(i: u32) -> Tag {
    Tag {
        seq: i,
        call: i ^ 0xA5,
        count: i.wrapping_mul(3),
    }
}

fn piece(i: u32, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b as u32 * 13 + i) as u8).collect()
}

/// Publishes piece `i` of `len` bytes, waiting for a free slot.
fn send(fifo: &Fifo, i: u32, len: usize) {
    let abort = AtomicBool::new(false);
    let slot = wait_until(
        || fifo.try_reserve(),
        None,
        Instant::now() + DEADLINE,
        &abort,
    )
    .expect("a free slot");
    let bytes = piece(i, len);
    // SAFETY: the slot holds slot_bytes >= len bytes and is ours until
    // published.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), slot, len) };
    fifo.publish(len, tag(i));
}

/// Takes the next piece, checking it is piece `i` of `len` bytes.
fn receive(fifo: &Fifo, i: u32, len: usize) {
    let abort = AtomicBool::new(false);
    let (slot, got, t) =
        wait_until(|| fifo.try_peek(), None, Instant::now() + DEADLINE, &abort).expect("a piece");
    assert_eq!((got, t), (len, tag(i)), "piece {i}");
    assert_eq!(
        // SAFETY: published with `got` bytes.
        unsafe { std::slice::from_raw_parts(slot, got) },
        piece(i, len).as_slice(),
        "piece {i}"
    );
    fifo.release();
}

/// Waits until `conn`'s receiving FIFO has failed.
fn fails(conn: &NetConnection) {
    let abort = AtomicBool::new(false);
    wait_until(
        || conn.recv_fifo().failed().then_some(()),
        None,
        Instant::now() + DEADLINE,
        &abort,
    )
    .expect("the connection to fail");
}

fn len_of(i: u32) -> usize {
    (i as usize * 389) % 4097
}

/// Two ranks exchange thousands of pieces of every length up to a whole
/// slot, both ways at once, in order and intact.
#[test]
fn many_slots_cross_both_ways_in_order() {
    let (a, b) = net_connection_pair(8, 4096);
    assert_eq!(Connection::transport(&a), "NET/Socket");
    exchange(&a, &b, 3000);
}

/// The same through the plug-in host, over libnccl-net-rcclrs and over the
/// C plug-in: the proxy drives a plug-in's requests like any provider's.
#[test]
fn many_slots_cross_both_ways_through_net_plugins() {
    for (path, name) in [
        (common::exported_plugin(), "NET/rcclrs"),
        (common::c_plugin(), "NET/Loopback"),
    ] {
        let (a, b) = common::plugin_pair(&path, 12);
        let (a, b) = net_connection_pair_over(a, b, 8, 4096);
        assert_eq!(Connection::transport(&a), name);
        exchange(&a, &b, 1000);
    }
}

/// Each side sends `pieces` pieces of every length to the other, both ways
/// at once: each arrives in order and intact.
fn exchange(a: &NetConnection, b: &NetConnection, pieces: u32) {
    std::thread::scope(|s| {
        for (me, other) in [(a, b), (b, a)] {
            s.spawn(move || {
                for i in 0..pieces {
                    send(me.send_fifo(), i, len_of(i));
                }
            });
            s.spawn(move || {
                for i in 0..pieces {
                    receive(other.recv_fifo(), i, len_of(i));
                }
            });
        }
    });
    assert!(a.failure().is_none() && b.failure().is_none());
}

/// A closing note reaches the peer after the pieces published before it;
/// the peer's FIFOs fail and its reason names who closed.
#[test]
fn a_closing_note_follows_the_published_pieces() {
    let (a, b) = net_connection_pair(4, 1024);
    for i in 0..3 {
        send(a.send_fifo(), i, 100);
    }
    a.close_with("rank 0 (host h, pid 1) aborted its communicator");
    assert!(a.send_fifo().failed() && a.recv_fifo().failed());
    for i in 0..3 {
        receive(b.recv_fifo(), i, 100);
    }
    fails(&b);
    assert_eq!(
        b.peer_note().as_deref(),
        Some("rank 0 (host h, pid 1) aborted its communicator")
    );
    let failure = b.failure().unwrap();
    assert!(
        failure.contains(b.peer()) && failure.contains("aborted its communicator"),
        "{failure}"
    );
    // Only the first note is sent; closing again is harmless.
    a.close_with("second");
    assert_eq!(a.failure(), None);
}

/// A peer whose slots are all full when this side closes (its reader is
/// slow, as on a loaded machine) still gets the note once it reads: the
/// closing side waits for the note to be taken, so the peer learns that
/// the connection ended in order instead of seeing it closed with no word.
/// Over the IB model, where a send needs a receive the peer posted.
#[test]
fn a_closing_note_waits_for_a_peer_whose_slots_are_full() {
    let (a, b) = common::ib_pair(1);
    let (a, b) = net_connection_pair_over(a, b, 4, 1024);
    assert_eq!(Connection::transport(&a), "NET/IB");
    for i in 0..4 {
        send(a.send_fifo(), i, 100);
    }
    let note = "rank 0 (host h, pid 1) destroyed its communicator";
    std::thread::scope(|s| {
        s.spawn(move || {
            a.close_with(note);
            drop(a);
        });
        std::thread::sleep(Duration::from_millis(400));
        for i in 0..4 {
            receive(b.recv_fifo(), i, 100);
        }
        fails(&b);
    });
    assert_eq!(b.peer_note().as_deref(), Some(note));
}

/// A note longer than the peer's slot is cut to fit, at a character
/// boundary.
#[test]
fn a_long_note_is_cut_to_a_slot() {
    let (a, b) = net_connection_pair(2, 64);
    let note = "é".repeat(100);
    a.close_with(&note);
    fails(&b);
    let got = b.peer_note().unwrap();
    assert!(
        got.len() <= 64 && note.starts_with(&got) && !got.is_empty(),
        "{got:?}"
    );
}

/// Pieces published right before the connection is dropped still arrive;
/// then the peer sees the connection closed, with a reason naming it.
#[test]
fn pieces_published_before_drop_still_arrive() {
    let (a, b) = net_connection_pair(4, 4096);
    for i in 0..4 {
        send(a.send_fifo(), i, 4096);
    }
    let t = Instant::now();
    drop(a);
    assert!(t.elapsed() < DEADLINE);
    for i in 0..4 {
        receive(b.recv_fifo(), i, 4096);
    }
    fails(&b);
    assert_eq!(b.peer_note(), None);
    let failure = b.failure().unwrap();
    assert!(
        failure.contains("closed") && failure.contains(b.peer().rsplit_once(':').unwrap().0),
        "{failure}"
    );
}

/// Closing a connection whose peer stopped reading gives up draining and
/// sending the note after their bounds instead of hanging, and dropping it
/// afterwards is quick.
#[test]
fn closing_gives_up_on_a_peer_that_stopped_reading() {
    const SLOT: usize = 1 << 20;
    let (a, b) = socket_pair();
    let (a_to_b, _b_never_reads) = connect(&*a, &*b);
    let (_b_to_a, a_from_b) = connect(&*b, &*a);
    let conn = NetConnection::start(a, a_to_b, a_from_b, 8, SLOT).unwrap();
    // Publish until the socket has taken all it will for a while.
    let fifo = conn.send_fifo();
    let mut stuck_since = None;
    while stuck_since.is_none_or(|t: Instant| t.elapsed() < Duration::from_millis(300)) {
        match fifo.try_reserve() {
            Some(_) => {
                fifo.publish(SLOT, tag(0));
                stuck_since = None;
            }
            None => {
                stuck_since.get_or_insert_with(Instant::now);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    assert!(!fifo.is_drained());
    let t = Instant::now();
    conn.close_with("giving up");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "close took {took:?}"
    );
    assert!(fifo.failed());
    let t = Instant::now();
    drop(conn);
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "drop took {:?}",
        t.elapsed()
    );
}

/// A message whose header disagrees with its size, or too short to hold
/// a header, fails the connection with a reason naming the sender.
#[test]
fn malformed_messages_fail_the_connection() {
    for (size, header_len) in [(10usize, 0u32), (SLOT_HEADER + 20, 30)] {
        let (raw, net) = socket_pair();
        let (mut rogue, from_rogue) = connect(&*raw, &*net);
        let (to_rogue, _rogue_in) = connect(&*net, &*raw);
        let conn = NetConnection::start(net, to_rogue, from_rogue, 4, 1024).unwrap();
        let mut bytes = vec![0u64; 256];
        let data = bytes.as_mut_ptr().cast::<u8>();
        // SAFETY: `bytes` outlives the send, which completes below.
        unsafe { rccl_transports::write_slot_header(data, header_len, tag(1)) };
        // SAFETY: as above.
        let mr =
            unsafe { raw.reg_mr(CommRef::Send(&rogue), data, 2048, MemoryType::Host) }.unwrap();
        let mut request = raw.isend(&mut rogue, data, size, 0, &mr).unwrap().unwrap();
        until("the rogue send", || raw.test(&mut request).unwrap());
        fails(&conn);
        let failure = conn.failure().unwrap();
        assert!(
            failure.contains("malformed") && failure.contains(conn.peer()),
            "{failure}"
        );
        assert!(conn.recv_fifo().try_peek().is_none());
    }
}

/// A message larger than a slot fails the connection before a byte of it
/// lands.
#[test]
fn a_message_larger_than_a_slot_fails_the_connection() {
    let (raw, net) = socket_pair();
    let (mut rogue, from_rogue) = connect(&*raw, &*net);
    let (to_rogue, _rogue_in) = connect(&*net, &*raw);
    let conn = NetConnection::start(net, to_rogue, from_rogue, 2, 64).unwrap();
    let mut bytes = vec![0u8; 4096];
    // SAFETY: `bytes` outlives the send, which completes below.
    let mr = unsafe {
        raw.reg_mr(
            CommRef::Send(&rogue),
            bytes.as_mut_ptr(),
            4096,
            MemoryType::Host,
        )
    }
    .unwrap();
    let mut request = raw
        .isend(&mut rogue, bytes.as_ptr(), 4096, 0, &mr)
        .unwrap()
        .unwrap();
    until("the rogue send", || raw.test(&mut request).unwrap());
    fails(&conn);
    assert!(
        conn.failure().unwrap().contains("truncated"),
        "{:?}",
        conn.failure()
    );
}

const ECHO_HANDLE: &str = "RCCL_NET_TEST_ECHO_HANDLE";
const ROUNDS: u32 = 200;

/// A connection both ways through the C plug-in with the process whose
/// listener `theirs` names, this side listening on `listen`.
fn plugin_connection(
    net: std::sync::Arc<rccl_transports::network::PluginNet>,
    mut listen: <rccl_transports::network::PluginNet as Net>::ListenComm,
    theirs: &[u8],
) -> NetConnection {
    let theirs = rccl_transports::network::ListenHandle::from_bytes(theirs).unwrap();
    let mut stage = Default::default();
    let (mut send, mut recv) = (None, None);
    until("the connection", || {
        if send.is_none() {
            send = net.connect(0, &theirs, &mut stage).unwrap();
        }
        if recv.is_none() {
            recv = net.accept(&mut listen).unwrap();
        }
        (send.is_some() && recv.is_some()).then_some(())
    });
    NetConnection::start(net, send.unwrap(), recv.unwrap(), 8, 4096).unwrap()
}

/// The echoing peer's process, run by the test below: sends back each
/// piece it receives.
fn echo(theirs: &str) -> ! {
    let (net, _) = common::plugin_pair(&common::c_plugin(), 8);
    let (handle, listen) = net.listen(0).unwrap();
    println!("{}", hex(handle.as_bytes()));
    let conn = plugin_connection(net, listen, &unhex(theirs));
    for i in 0..ROUNDS {
        receive(conn.recv_fifo(), i, 8);
        send(conn.send_fifo(), i, 8);
    }
    drop(conn);
    std::process::exit(0);
}

/// A ping-pong with another process through the C plug-in: every message
/// arrives, in order, on connections the network proxy drives (how short
/// its sleeps stay while messages flow is the proxy's own unit test).
#[test]
fn a_ping_pong_with_another_process_through_a_plugin() {
    if let Ok(theirs) = std::env::var(ECHO_HANDLE) {
        echo(&theirs);
    }
    let (net, _) = common::plugin_pair(&common::c_plugin(), 8);
    let (handle, listen) = net.listen(0).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "a_ping_pong_with_another_process_through_a_plugin",
            "--exact",
            "--nocapture",
        ])
        .env(ECHO_HANDLE, hex(handle.as_bytes()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    while !line.starts_with("rcclhandle") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0,
            "the echoing process said no handle"
        );
        let trimmed = line.trim();
        if trimmed.len() == 256 && trimmed.bytes().all(|b| b.is_ascii_hexdigit()) {
            line = format!("rcclhandle{trimmed}");
        }
    }
    let conn = plugin_connection(net, listen, &unhex(&line["rcclhandle".len()..]));
    for i in 0..ROUNDS {
        send(conn.send_fifo(), i, 8);
        receive(conn.recv_fifo(), i, 8);
    }
    assert!(child.wait().unwrap().success());
}

/// FIFO memory laid out as device work's connections lay it: the control
/// block and the slots apart (the slots standing for device memory when
/// `device`).
struct SplitMemory {
    control: HeapMemory,
    slots: HeapMemory,
    len: usize,
    device: bool,
}

impl FifoMemory for SplitMemory {
    fn base(&self) -> *mut u8 {
        self.control.base()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn slots(&self) -> *mut u8 {
        self.slots.base()
    }
    fn slots_on_device(&self) -> bool {
        self.device
    }
}

fn split(nslots: usize, slot_bytes: usize, device: bool) -> Arc<dyn FifoMemory> {
    let len = fifo_bytes(Protocol::Simple, nslots, slot_bytes);
    Arc::new(SplitMemory {
        control: HeapMemory::new(control_bytes()),
        slots: HeapMemory::new(len - control_bytes()),
        len,
        device,
    })
}

/// A connection for device work: pieces its producer publishes through a
/// handle of its own, ringing no doorbell (as a GPU's work does), into
/// slots apart from their counters, reach the peer in order; and the
/// peer's pieces reach that side's own consumer handle.
#[test]
fn a_connection_for_device_work_moves_slots_published_without_a_doorbell() {
    let (nslots, slot_bytes) = (4, 1024);
    let (a, b) = socket_pair();
    let (a_to_b, b_from_a) = connect(&*a, &*b);
    let (b_to_a, a_from_b) = connect(&*b, &*a);
    let memory = [
        split(nslots, slot_bytes, false),
        split(nslots, slot_bytes, false),
    ];
    let device_side =
        NetConnection::start_for_device(a, a_to_b, a_from_b, nslots, slot_bytes, memory).unwrap();
    let peer = NetConnection::start(b, b_to_a, b_from_a, nslots, slot_bytes).unwrap();
    let _polling = keep_polling();
    let handle =
        |fifo: &Fifo| Fifo::in_memory(fifo.memory().clone(), Protocol::Simple, nslots, slot_bytes);
    let (device_send, device_recv) = (
        handle(device_side.send_fifo()),
        handle(device_side.recv_fifo()),
    );
    for i in 0..40 {
        let len = 1 + (i as usize * 97) % slot_bytes;
        send(&device_send, i, len);
        receive(peer.recv_fifo(), i, len);
        send(peer.send_fifo(), i, len);
        receive(&device_recv, i, len);
    }
}

/// Slots in device memory need a network that registers it: Socket
/// refuses them, naming the memory.
#[test]
fn device_slots_need_a_network_that_registers_device_memory() {
    let (a, b) = socket_pair();
    let (a_to_b, _b_from_a) = connect(&*a, &*b);
    let (_b_to_a, a_from_b) = connect(&*b, &*a);
    let memory = [split(2, 64, true), split(2, 64, true)];
    let err = NetConnection::start_for_device(a, a_to_b, a_from_b, 2, 64, memory).unwrap_err();
    assert!(err.to_string().contains("Socket"), "{err}");
}
