//! The network interface's contract ([`rccl_transports::network`]),
//! checked against any [`Net`] provider: ordering, grouped receives by tag,
//! a receive larger than its send, 32 requests in flight, connect and
//! accept that never block, closing with requests pending, registration
//! bounds. Run here against the Socket provider, which also gets its own
//! checks (secrets, a peer process killed mid-transfer), and against the
//! plug-in host loading two NCCL net plug-ins: libnccl-net-rcclrs (this
//! repository's networks exported as a plug-in: Socket at interface v12,
//! v10 and v8, IB over the verbs model at v12) and the minimal C plug-in of
//! `tests/c/loopback_net.c` (v8).

mod common;

use std::time::{Duration, Instant};

use common::{connect, until, DEADLINE};
use rccl_transports::network::{
    CommRef, Endpoint, MemoryType, Net, NetError, RecvBuffer, Sizes, NET_MAX_REQUESTS,
};

/// Registers `buf` on `comm`.
fn register<N: Net>(net: &N, comm: CommRef<'_, N>, buf: &mut [u8]) -> N::MemHandle {
    // SAFETY: every test declares its buffers before its communicators and
    // requests, so the buffers outlive them, and reads a buffer only after
    // its request completed.
    unsafe { net.reg_mr(comm, buf.as_mut_ptr(), buf.len(), MemoryType::Host) }.unwrap()
}

/// Tests every request until all are done: their sizes, in order.
fn complete<N: Net>(net: &N, requests: Vec<N::Request>) -> Vec<Sizes> {
    let mut pending: Vec<(usize, N::Request)> = requests.into_iter().enumerate().collect();
    let mut sizes = vec![Sizes::default(); pending.len()];
    until("requests to complete", || {
        pending.retain_mut(|(i, request)| match net.test(request).unwrap() {
            Some(done) => {
                sizes[*i] = done;
                false
            }
            None => true,
        });
        pending.is_empty().then_some(())
    });
    sizes
}

/// Tests `request` until it fails; the error.
fn failure<N: Net>(net: &N, request: &mut N::Request) -> NetError {
    until("the request to fail", || match net.test(request) {
        Ok(Some(sizes)) => panic!("completed with {sizes:?} instead of failing"),
        Ok(None) => None,
        Err(e) => Some(e),
    })
}

/// How a provider reports what went wrong on the wire or at the peer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Errors {
    /// As the [`NetError`] variant that says it (Rust providers).
    Typed,
    /// As [`NetError::Plugin`]: an `ncclResult_t` and the plug-in's
    /// warning, all a C plug-in can say.
    Coded,
}

/// Checks that `err` is what `typed` accepts, or a plug-in's coded error.
fn expect_error(errors: Errors, err: &NetError, typed: impl Fn(&NetError) -> bool) {
    match errors {
        Errors::Typed => assert!(typed(err), "{err}"),
        Errors::Coded => assert!(matches!(err, NetError::Plugin { .. }), "{err}"),
    }
}

fn pattern(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b * 31 + i * 7) as u8).collect()
}

fn one<'a, N: Net>(data: &mut [u8], tag: i32, mhandle: &'a N::MemHandle) -> RecvBuffer<'a, N> {
    RecvBuffer {
        data: data.as_mut_ptr(),
        size: data.len(),
        tag,
        mhandle,
    }
}

/// Messages of many sizes (zero included), some sent before their receive
/// is posted, arrive in posting order, each reporting its real size.
fn sends_and_receives_match_in_posting_order<N: Net>(a: &N, b: &N) {
    const N_MSGS: usize = 24;
    const ROOM: usize = 8192;
    let sizes: Vec<usize> = (0..N_MSGS)
        .map(|i| if i == 5 { 0 } else { (i * 997) % 5000 + 1 })
        .collect();
    let mut out: Vec<u8> = sizes
        .iter()
        .enumerate()
        .flat_map(|(i, &len)| pattern(i, len))
        .collect();
    let mut into = vec![0u8; N_MSGS * ROOM];
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    let mut sends = Vec::new();
    let mut at = 0;
    for &len in &sizes {
        let data = out[at..].as_ptr();
        sends.push(a.isend(&mut send, data, len, 0, &send_mr).unwrap().unwrap());
        at += len;
    }
    let mut recvs = Vec::new();
    for chunk in into.chunks_mut(ROOM) {
        recvs.push(
            b.irecv(&mut recv, &[one::<N>(chunk, 0, &recv_mr)])
                .unwrap()
                .unwrap(),
        );
    }
    let sent = complete(a, sends);
    let received = complete(b, recvs);
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(sent[i].as_slice(), [len], "send {i}");
        assert_eq!(received[i].as_slice(), [len], "receive {i}");
        assert_eq!(
            &into[i * ROOM..i * ROOM + len],
            pattern(i, len).as_slice(),
            "message {i}"
        );
    }
}

/// A receive larger than its send reports the real size and leaves the
/// rest of its buffer alone.
fn a_receive_larger_than_its_send_reports_the_real_size<N: Net>(a: &N, b: &N) {
    let mut out = pattern(1, 100);
    let mut into = vec![0xEEu8; 4096];
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    let r = b
        .irecv(&mut recv, &[one::<N>(&mut into, 0, &recv_mr)])
        .unwrap()
        .unwrap();
    let s = a
        .isend(&mut send, out.as_ptr(), 100, 0, &send_mr)
        .unwrap()
        .unwrap();
    assert_eq!(complete(a, vec![s])[0].as_slice(), [100]);
    assert_eq!(complete(b, vec![r])[0].as_slice(), [100]);
    assert_eq!(&into[..100], &out[..]);
    assert!(into[100..].iter().all(|&b| b == 0xEE));
}

/// A send larger than the receive it matches fails the receive, naming
/// the sender and both sizes.
fn a_send_larger_than_its_receive_is_an_error<N: Net>(a: &N, b: &N, errors: Errors) {
    let mut out = vec![1u8; 200];
    let mut into = vec![0u8; 100];
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    let mut r = b
        .irecv(&mut recv, &[one::<N>(&mut into, 0, &recv_mr)])
        .unwrap()
        .unwrap();
    let s = a
        .isend(&mut send, out.as_ptr(), 200, 0, &send_mr)
        .unwrap()
        .unwrap();
    complete(a, vec![s]);
    let err = failure(b, &mut r);
    expect_error(errors, &err, |err| {
        matches!(
            err,
            NetError::Truncated {
                sent: 200,
                posted: 100,
                ..
            }
        )
    });
    assert!(err.to_string().contains(&recv.peer()), "{err}");
}

/// A grouped receive takes the next sends, each into the empty buffer of
/// its tag (equal tags in order), completes only when every buffer is
/// filled, and reports one size per buffer; a send whose tag matches no
/// empty buffer of the first group posted is an error, even if a later
/// group has that tag.
fn grouped_receives_place_sends_by_tag<N: Net>(a: &N, b: &N, errors: Errors) {
    let max_recvs = b.properties(0).unwrap().max_recvs;
    let mut out = vec![0u8; 1024];
    let mut into = vec![0u8; 8 * 64];
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    if max_recvs < 3 {
        let (x, y) = into.split_at_mut(64);
        let refused = b.irecv(
            &mut recv,
            &[
                one::<N>(x, 1, &recv_mr),
                one::<N>(&mut y[..64], 2, &recv_mr),
            ],
        );
        assert!(matches!(refused, Err(NetError::InvalidArgument(_))));
        return;
    }
    for (i, chunk) in out.chunks_mut(64).enumerate() {
        chunk.fill(b'a' + i as u8);
    }
    let mut bufs: Vec<&mut [u8]> = into.chunks_mut(64).collect();
    let (g1, rest) = bufs.split_at_mut(3);
    let group = [
        one::<N>(g1[0], 7, &recv_mr),
        one::<N>(g1[1], 3, &recv_mr),
        one::<N>(g1[2], 5, &recv_mr),
    ];
    let mut r1 = b.irecv(&mut recv, &group).unwrap().unwrap();
    let (g2, rest) = rest.split_at_mut(2);
    let r2 = b
        .irecv(
            &mut recv,
            &[one::<N>(g2[0], 4, &recv_mr), one::<N>(g2[1], 4, &recv_mr)],
        )
        .unwrap()
        .unwrap();
    let (g3, g4) = rest.split_at_mut(2);
    let mut r3 = b
        .irecv(
            &mut recv,
            &[one::<N>(g3[0], 1, &recv_mr), one::<N>(g3[1], 2, &recv_mr)],
        )
        .unwrap()
        .unwrap();
    let _r4 = b
        .irecv(&mut recv, &[one::<N>(g4[0], 3, &recv_mr)])
        .unwrap()
        .unwrap();
    // Group 1: tags 5, 7 arrive; the group waits for tag 3. (Their sends
    // may complete before it or with the group, as on NCCL's IB.)
    let base = out.as_ptr();
    let at = |i: usize| base.wrapping_add(i * 64);
    let mut sends = vec![
        a.isend(&mut send, at(0), 10, 5, &send_mr).unwrap().unwrap(),
        a.isend(&mut send, at(1), 20, 7, &send_mr).unwrap().unwrap(),
    ];
    let mut sent = [false; 2];
    let deadline = Instant::now() + Duration::from_millis(200);
    while Instant::now() < deadline {
        for (request, done) in sends.iter_mut().zip(&mut sent) {
            if !*done {
                *done = a.test(request).unwrap().is_some();
            }
        }
        assert_eq!(
            b.test(&mut r1).unwrap(),
            None,
            "the group completed without tag 3"
        );
    }
    let mut sends: Vec<N::Request> = sends
        .into_iter()
        .zip(sent)
        .filter_map(|(request, done)| (!done).then_some(request))
        .collect();
    sends.push(a.isend(&mut send, at(2), 30, 3, &send_mr).unwrap().unwrap());
    // Group 2: two sends of one tag fill its buffers in order.
    sends.push(a.isend(&mut send, at(3), 11, 4, &send_mr).unwrap().unwrap());
    sends.push(a.isend(&mut send, at(4), 12, 4, &send_mr).unwrap().unwrap());
    // Group 3 has tags 1 and 2; a send of tag 3 (group 4's) must not
    // overtake it.
    sends.push(a.isend(&mut send, at(5), 13, 1, &send_mr).unwrap().unwrap());
    sends.push(a.isend(&mut send, at(6), 14, 3, &send_mr).unwrap().unwrap());
    complete(a, sends);
    let done = complete(b, vec![r1, r2]);
    assert_eq!(done[0].as_slice(), [20, 30, 10]);
    assert_eq!(done[1].as_slice(), [11, 12]);
    let filled =
        |i: usize, len: usize, byte: u8| into[i * 64..i * 64 + len].iter().all(|&b| b == byte);
    assert!(filled(0, 20, b'b') && filled(1, 30, b'c') && filled(2, 10, b'a'));
    assert!(filled(3, 11, b'd') && filled(4, 12, b'e'));
    let err = failure(b, &mut r3);
    expect_error(errors, &err, |err| {
        matches!(err, NetError::UnexpectedTag { tag: 3, .. })
    });
}

/// A receiving communicator takes 32 receives at once and refuses the
/// 33rd; a sending one takes 32 x max_recvs sends and refuses one more;
/// both stay usable, and a slot freed by a completed request takes a new
/// one.
fn thirty_two_requests_in_flight_and_no_more<N: Net>(a: &N, b: &N) {
    let send_limit = NET_MAX_REQUESTS * b.properties(0).unwrap().max_recvs;
    let mut out: Vec<u8> = (0..send_limit + 1).map(|i| i as u8).collect();
    let mut into = vec![0u8; NET_MAX_REQUESTS * 8];
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    let base = into.as_mut_ptr();
    let buffer = |i: usize| RecvBuffer::<N> {
        data: base.wrapping_add((i % NET_MAX_REQUESTS) * 8),
        size: 8,
        tag: 0,
        mhandle: &recv_mr,
    };
    let mut recvs: std::collections::VecDeque<N::Request> = (0..NET_MAX_REQUESTS)
        .map(|i| b.irecv(&mut recv, &[buffer(i)]).unwrap().unwrap())
        .collect();
    let err = b
        .irecv(&mut recv, &[buffer(0)])
        .err()
        .expect("the 33rd receive was taken");
    assert!(
        matches!(
            err,
            NetError::TooManyRequests {
                limit: NET_MAX_REQUESTS
            }
        ),
        "{err}"
    );
    let mut sends: Vec<N::Request> = (0..send_limit)
        .map(|i| {
            a.isend(&mut send, out[i..].as_ptr(), 1, 0, &send_mr)
                .unwrap()
                .unwrap()
        })
        .collect();
    let err = a
        .isend(&mut send, out.as_ptr(), 1, 0, &send_mr)
        .err()
        .expect("one send too many was taken");
    assert!(matches!(err, NetError::TooManyRequests { .. }), "{err}");
    // Receive every send, reposting each completed receive's buffer.
    let mut received = 0;
    let mut posted = NET_MAX_REQUESTS;
    until("every send to be received", || {
        while let Some(front) = recvs.front_mut() {
            let Some(sizes) = b.test(front).unwrap() else {
                break;
            };
            assert_eq!(sizes.as_slice(), [1]);
            assert_eq!(
                into[(received % NET_MAX_REQUESTS) * 8],
                received as u8,
                "message {received}"
            );
            recvs.pop_front();
            received += 1;
            if posted < send_limit {
                recvs.push_back(b.irecv(&mut recv, &[buffer(posted)]).unwrap().unwrap());
                posted += 1;
            }
        }
        sends.retain_mut(|s| a.test(s).unwrap().is_none());
        (received == send_limit).then_some(())
    });
    let last = a
        .isend(&mut send, out[send_limit..].as_ptr(), 1, 0, &send_mr)
        .unwrap()
        .unwrap();
    // A network may hold a send until its receive is posted.
    let last_recv = b.irecv(&mut recv, &[buffer(send_limit)]).unwrap().unwrap();
    complete(a, vec![last]);
    complete(b, vec![last_recv]);
}

/// `accept` returns at once while nobody connected, `connect` returns at
/// once while the listener has not answered, and driving both from one
/// thread establishes the connection; a listener nobody accepts on leaves
/// `connect` returning `None`, never blocking.
fn connect_and_accept_never_block<N: Net>(a: &N, b: &N) {
    const QUICK: Duration = Duration::from_millis(200);
    let timed = |what: &str, call: &mut dyn FnMut() -> bool| {
        let t = Instant::now();
        let done = call();
        assert!(t.elapsed() < QUICK, "{what} took {:?}", t.elapsed());
        done
    };
    let (handle, mut listen) = b.listen(0).unwrap();
    for _ in 0..3 {
        assert!(!timed("accept with nobody connecting", &mut || b
            .accept(&mut listen)
            .unwrap()
            .is_some()));
    }
    let mut stage = N::ConnectStage::default();
    let mut send = None;
    let mut recv = None;
    assert!(!timed("the first connect", &mut || {
        send = a.connect(0, &handle, &mut stage).unwrap();
        send.is_some()
    }));
    let mut accept_waited = false;
    until("the connection", || {
        if recv.is_none() {
            timed("accept", &mut || {
                recv = b.accept(&mut listen).unwrap();
                recv.is_some()
            });
            accept_waited |= recv.is_none();
        }
        if send.is_none() {
            timed("connect", &mut || {
                send = a.connect(0, &handle, &mut stage).unwrap();
                send.is_some()
            });
        }
        (send.is_some() && recv.is_some()).then_some(())
    });
    assert!(
        accept_waited,
        "accept finished before connect was called again"
    );
    // A listener nobody accepts on.
    let (handle, _listen) = b.listen(0).unwrap();
    let mut stage = N::ConnectStage::default();
    for _ in 0..20 {
        assert!(!timed("connect to a silent listener", &mut || a
            .connect(0, &handle, &mut stage)
            .unwrap()
            .is_some()));
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Closing a communicator with requests pending: its own requests fail at
/// once; the peer's pending requests fail within the deadline, naming this
/// side; nothing blocks.
fn closing_with_requests_pending<N: Net>(a: &N, b: &N, errors: Errors) {
    const BIG: usize = 8 << 20;
    let mut out = vec![3u8; BIG];
    let mut into = vec![0u8; BIG];
    // The receiver closes with receives pending, while the sender has more
    // in flight than the socket buffers hold.
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    let mut r = b
        .irecv(&mut recv, &[one::<N>(&mut into, 0, &recv_mr)])
        .unwrap()
        .unwrap();
    let mut sends: Vec<N::Request> = (0..4)
        .map(|_| {
            a.isend(&mut send, out.as_ptr(), BIG, 0, &send_mr)
                .unwrap()
                .unwrap()
        })
        .collect();
    let t = Instant::now();
    b.close_recv(recv).unwrap();
    assert!(matches!(b.test(&mut r), Err(NetError::Aborted { .. })));
    let mut last = sends.pop().unwrap();
    let err = failure(a, &mut last);
    assert!(t.elapsed() < DEADLINE);
    assert!(
        err.to_string().contains(&send.peer()),
        "{err} does not name {}",
        send.peer()
    );
    a.close_send(send).unwrap();

    // The sender closes with a send half on the wire.
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    let mut s = a
        .isend(&mut send, out.as_ptr(), BIG, 0, &send_mr)
        .unwrap()
        .unwrap();
    // Let part of it reach the socket.
    let _ = a.test(&mut s).unwrap();
    a.close_send(send).unwrap();
    assert!(matches!(a.test(&mut s), Err(NetError::Aborted { .. })));
    let mut r = b
        .irecv(&mut recv, &[one::<N>(&mut into, 0, &recv_mr)])
        .unwrap()
        .unwrap();
    let err = failure(b, &mut r);
    // Only a stream network knows a message was cut.
    let stream = a.name() == "Socket";
    expect_error(
        errors,
        &err,
        |err| matches!(err, NetError::Closed { mid_message, .. } if *mid_message || !stream),
    );
    assert!(err.to_string().contains(&recv.peer()), "{err}");
    // The communicator stays failed.
    assert!(b
        .irecv(&mut recv, &[one::<N>(&mut into, 0, &recv_mr)])
        .is_err());
}

/// A sender that saw its last send complete may close at once (its
/// process may end): the receive it completed still completes, with its
/// data, however late the receiver looks; the next receive fails.
fn what_completed_before_the_peer_closed_still_arrives<N: Net>(a: &N, b: &N) {
    const LEN: usize = 64 << 10;
    let mut out = pattern(3, LEN);
    let mut into = vec![0u8; 2 * LEN];
    let (mut send, mut recv) = connect(a, b);
    let send_mr = register(a, CommRef::Send(&send), &mut out);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into);
    let (first, second) = into.split_at_mut(LEN);
    let r = b
        .irecv(&mut recv, &[one::<N>(first, 0, &recv_mr)])
        .unwrap()
        .unwrap();
    let s = a
        .isend(&mut send, out.as_ptr(), LEN, 0, &send_mr)
        .unwrap()
        .unwrap();
    complete(a, vec![s]);
    a.close_send(send).unwrap();
    // Long enough for the receiver's side to see the close.
    std::thread::sleep(Duration::from_millis(200));
    let received = complete(b, vec![r]);
    assert_eq!(received[0].as_slice(), [LEN]);
    assert!(first == pattern(3, LEN).as_slice(), "the data arrived");
    let late = b.irecv(&mut recv, &[one::<N>(second, 0, &recv_mr)]);
    match late {
        Ok(Some(mut r)) => drop(failure(b, &mut r)),
        Ok(None) => panic!("a receive after the peer closed was deferred, not refused"),
        Err(_) => {}
    }
}

/// Properties are sane; registrations refuse memory the provider cannot
/// move and bound every buffer; bad requests are refused without harm; a
/// flush of host memory completes; a request is done once.
fn properties_registration_and_misuse<N: Net>(a: &N, b: &N) {
    assert!(a.devices() >= 1);
    let props = a.properties(0).unwrap();
    assert!(props.ptr_support.host);
    assert!((1..=rccl_transports::network::MAX_RECVS).contains(&props.max_recvs));
    assert!(props.speed_mbps > 0 && props.max_comms > 0 && props.max_p2p_bytes > 0);
    assert!(a.properties(a.devices()).is_err());
    let mut out = [5u8; 64];
    let mut into = [0u8; 64];
    let (mut send, mut recv) = connect(a, b);
    if !props.ptr_support.cuda {
        // SAFETY: refused before anything is kept.
        let refused =
            unsafe { a.reg_mr(CommRef::Send(&send), out.as_mut_ptr(), 64, MemoryType::Cuda) };
        assert!(matches!(refused, Err(NetError::Unsupported { .. })));
    }
    let send_mr = register(a, CommRef::Send(&send), &mut out[..32]);
    let recv_mr = register(b, CommRef::Recv(&recv), &mut into[..32]);
    let outside = a.isend(&mut send, out.as_ptr(), 33, 0, &send_mr);
    assert!(matches!(outside, Err(NetError::InvalidArgument(_))));
    let outside = b.irecv(&mut recv, &[one::<N>(&mut into[16..48], 0, &recv_mr)]);
    assert!(matches!(outside, Err(NetError::InvalidArgument(_))));
    assert!(matches!(
        b.irecv(&mut recv, &[]),
        Err(NetError::InvalidArgument(_))
    ));
    let mut r = b
        .irecv(&mut recv, &[one::<N>(&mut into[..32], 0, &recv_mr)])
        .unwrap()
        .unwrap();
    let s = a
        .isend(&mut send, out.as_ptr(), 32, 0, &send_mr)
        .unwrap()
        .unwrap();
    complete(a, vec![s]);
    until("the receive", || b.test(&mut r).unwrap());
    assert!(matches!(b.test(&mut r), Err(NetError::InvalidArgument(_))));
    let mut flush = until("a flush to start", || {
        b.iflush(&mut recv, &[one::<N>(&mut into[..32], 0, &recv_mr)])
            .unwrap()
    });
    until("the flush", || b.test(&mut flush).unwrap());
    a.dereg_mr(CommRef::Send(&send), send_mr).unwrap();
    b.dereg_mr(CommRef::Recv(&recv), recv_mr).unwrap();
    a.close_send(send).unwrap();
    b.close_recv(recv).unwrap();
}

/// Every contract check above as a test of one provider: `$pair` makes two
/// instances of it, `$errors` says how it reports failures.
macro_rules! conformance {
    ($provider:ident, $pair:expr, $errors:expr) => {
        mod $provider {
            use super::*;
            conformance!(@each $pair, ();
                sends_and_receives_match_in_posting_order,
                a_receive_larger_than_its_send_reports_the_real_size,
                thirty_two_requests_in_flight_and_no_more,
                connect_and_accept_never_block,
                what_completed_before_the_peer_closed_still_arrives,
                properties_registration_and_misuse);
            conformance!(@each $pair, ($errors);
                a_send_larger_than_its_receive_is_an_error,
                grouped_receives_place_sends_by_tag,
                closing_with_requests_pending);
        }
    };
    (@each $pair:expr, $errors:tt; $check:ident $(, $rest:ident)*) => {
        #[test]
        fn $check() {
            let (a, b) = $pair;
            conformance!(@call $check, a, b, $errors);
        }
        conformance!(@each $pair, $errors; $($rest),*);
    };
    (@each $pair:expr, $errors:tt;) => {};
    (@call $check:ident, $a:ident, $b:ident, ()) => {
        super::$check(&*$a, &*$b)
    };
    (@call $check:ident, $a:ident, $b:ident, ($errors:expr)) => {
        super::$check(&*$a, &*$b, $errors)
    };
}

conformance!(socket, common::socket_pair(), Errors::Typed);
conformance!(
    socket_encrypted,
    common::encrypted_socket_pair(),
    Errors::Typed
);
conformance!(ib_model, common::ib_pair(1), Errors::Typed);
conformance!(ib_model_four_qps, common::ib_pair(4), Errors::Typed);
conformance!(
    exported_plugin_v12,
    common::exported_plugin_pair("socket", 12),
    Errors::Coded
);
conformance!(
    exported_plugin_v10,
    common::exported_plugin_pair("socket", 10),
    Errors::Coded
);
conformance!(
    exported_plugin_v8,
    common::exported_plugin_pair("socket", 8),
    Errors::Coded
);
conformance!(
    exported_plugin_ib_model,
    common::exported_plugin_pair("ib", 12),
    Errors::Coded
);
conformance!(
    c_plugin,
    common::plugin_pair(&common::c_plugin(), 8),
    Errors::Coded
);

/// How libnccl-net-rcclrs refuses a network it cannot run.
mod exported_plugin_only {
    use super::*;
    use rccl_transports::network::{abi, Plugin};

    /// `init` under `settings`: its error (`None`: it succeeded).
    fn init_error(copy: &str, settings: &[(&str, &str)]) -> Option<NetError> {
        common::with_exported_plugin(copy, settings, |path| {
            let plugin = Plugin::load_version(Some(path.to_str().unwrap()), 12).unwrap();
            plugin.open(1).err()
        })
    }

    #[test]
    fn nccl_plugin_p2p_naming_no_network_of_the_plugin_fails_init_saying_so() {
        let err = init_error("bad-p2p", &[("NCCL_PLUGIN_P2P", "verbs")]).expect("init failed");
        let text = err.to_string();
        assert!(
            matches!(
                err,
                NetError::Plugin {
                    code: abi::INVALID_ARGUMENT,
                    ..
                }
            ),
            "{text}"
        );
        assert!(
            text.contains("init failed")
                && text.contains(
                    "NCCL_PLUGIN_P2P=verbs: the networks of this plug-in are ib and socket"
                ),
            "{text}"
        );
    }

    #[test]
    fn nccl_plugin_p2p_ib_without_a_device_fails_init_saying_why() {
        if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()) {
            eprintln!("skipping: this machine has an RDMA device");
            return;
        }
        let err = init_error("no-ib", &[("NCCL_PLUGIN_P2P", "ib")]).expect("init failed");
        let text = err.to_string();
        assert!(
            matches!(
                err,
                NetError::Plugin {
                    code: abi::INVALID_ARGUMENT,
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("IB unavailable: "), "{text}");
    }
}

/// Checks of the Socket provider beyond the common contract.
mod socket_only {
    use super::*;
    use common::{hex, socket, unhex};
    use rccl_transports::auth_tcp::Secret;
    use rccl_transports::network::ListenHandle;
    use rccl_transports::network::Socket;

    /// A connecting side with another secret is refused, and the listener
    /// then accepts a member of the communicator.
    #[test]
    fn a_wrong_secret_is_refused_and_the_listener_keeps_accepting() {
        let secret = Secret::random();
        let (member, outsider, listener) =
            (socket(secret), socket(Secret::random()), socket(secret));
        let (handle, mut listen) = listener.listen(0).unwrap();
        let mut stage = Default::default();
        let err = until("the outsider to be refused", || {
            assert!(
                listener.accept(&mut listen).unwrap().is_none(),
                "accepted an outsider"
            );
            match outsider.connect(0, &handle, &mut stage) {
                Ok(None) => None,
                Ok(Some(_)) => panic!("an outsider connected"),
                Err(e) => Some(e),
            }
        });
        assert!(matches!(err, NetError::Refused { .. }), "{err}");
        let mut stage = Default::default();
        let (mut send, mut recv) = (None, None);
        until("the member's connection", || {
            if send.is_none() {
                send = member.connect(0, &handle, &mut stage).unwrap();
            }
            if recv.is_none() {
                recv = listener.accept(&mut listen).unwrap();
            }
            (send.is_some() && recv.is_some()).then_some(())
        });
        let malformed = ListenHandle::from_bytes(b"not a handle").unwrap();
        assert!(member
            .connect(0, &malformed, &mut Default::default())
            .is_err());
    }

    const CHILD_HANDLE: &str = "RCCL_NET_TEST_CHILD_HANDLE";
    const CHILD_SECRET: &str = "RCCL_NET_TEST_CHILD_SECRET";

    /// The sending peer's process, run by the test below: connects to the
    /// handle it is given and sends 8 MiB messages until it is killed.
    fn child_sender(handle: &str, secret: &str) -> ! {
        let secret = Secret(unhex(secret).try_into().unwrap());
        let net = socket(secret);
        let handle = ListenHandle::from_bytes(&unhex(handle)).unwrap();
        let mut stage = Default::default();
        let mut send = until("connecting to the parent", || {
            net.connect(0, &handle, &mut stage).unwrap()
        });
        let mut out = vec![9u8; 8 << 20];
        let mr = register(&*net, CommRef::Send(&send), &mut out);
        loop {
            let request = net
                .isend(&mut send, out.as_ptr(), out.len(), 0, &mr)
                .unwrap()
                .unwrap();
            complete(&*net, vec![request]);
        }
    }

    /// A peer process killed in the middle of a transfer fails the pending
    /// receive within the deadline, with an error naming the peer.
    #[test]
    fn a_peer_killed_mid_transfer_fails_the_receive_within_the_deadline() {
        if let (Ok(handle), Ok(secret)) = (std::env::var(CHILD_HANDLE), std::env::var(CHILD_SECRET))
        {
            child_sender(&handle, &secret);
        }
        let secret = Secret::random();
        let net: std::sync::Arc<Socket> = socket(secret);
        let (handle, mut listen) = net.listen(0).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "socket_only::a_peer_killed_mid_transfer_fails_the_receive_within_the_deadline",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD_HANDLE, hex(handle.as_bytes()))
            .env(CHILD_SECRET, hex(&secret.0))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut into = vec![0u8; 8 << 20];
        let mut recv = until("the child to connect", || net.accept(&mut listen).unwrap());
        let mr = register(&*net, CommRef::Recv(&recv), &mut into);
        // One whole message arrives: the transfer is under way.
        let first = net
            .irecv(&mut recv, &[one::<Socket>(&mut into, 0, &mr)])
            .unwrap()
            .unwrap();
        assert_eq!(complete(&*net, vec![first])[0].as_slice(), [8 << 20]);
        child.kill().unwrap();
        let killed = Instant::now();
        // Messages the child wrote whole before it died may still arrive.
        let mut pending = None;
        let err = until("a receive to fail", || {
            if pending.is_none() {
                pending = net
                    .irecv(&mut recv, &[one::<Socket>(&mut into, 0, &mr)])
                    .unwrap();
            }
            match net.test(pending.as_mut()?) {
                Ok(None) => None,
                Ok(Some(_)) => {
                    pending = None;
                    None
                }
                Err(e) => Some(e),
            }
        });
        let _ = child.wait();
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "took {:?}",
            killed.elapsed()
        );
        assert!(
            err.to_string().contains(&recv.peer()),
            "{err} does not name {}",
            recv.peer()
        );
        assert!(
            matches!(err, NetError::Closed { .. } | NetError::Io { .. }),
            "{err}"
        );
    }
}

/// Faults injected into the verbs model under the IB provider: each ends
/// in an error at both ends, naming the peer, within the deadline; no
/// receive completes with wrong data.
/// The IB provider's sends complete with their receive, not before.
mod ib_only {
    use super::*;
    use rccl_transports::network::Ib;

    /// A send of a grouped receive is done only once the whole group's
    /// signal landed: its data alone being written does not make it done,
    /// since a sender that then closed would leave the receive waiting for
    /// a signal that never comes.
    #[test]
    fn a_send_is_done_once_the_receiver_is_signalled() {
        let (a, b) = common::ib_pair(2);
        let mut out = pattern(5, 4096);
        let mut into = vec![0u8; 2 * 4096];
        let (mut send, mut recv) = connect(&*a, &*b);
        let send_mr = register(&*a, CommRef::Send(&send), &mut out);
        let recv_mr = register(&*b, CommRef::Recv(&recv), &mut into);
        let (x, y) = into.split_at_mut(4096);
        let r = b
            .irecv(
                &mut recv,
                &[one::<Ib>(x, 1, &recv_mr), one::<Ib>(y, 2, &recv_mr)],
            )
            .unwrap()
            .unwrap();
        let mut first = a
            .isend(&mut send, out.as_ptr(), 4096, 1, &send_mr)
            .unwrap()
            .unwrap();
        // Long enough for the first send's data to be written and
        // acknowledged.
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            assert!(
                a.test(&mut first).unwrap().is_none(),
                "a send of a half-matched group was done"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let second = a
            .isend(&mut send, out.as_ptr(), 4096, 2, &send_mr)
            .unwrap()
            .unwrap();
        complete(&*a, vec![first, second]);
        a.close_send(send).unwrap();
        assert_eq!(complete(&*b, vec![r])[0].as_slice(), [4096, 4096]);
    }
}

mod ib_faults {
    use super::*;
    use common::ib_on;
    use rccl_transports::auth_tcp::Secret;
    use rccl_transports::network::{Ib, IbConfig};
    use rccl_transports::verbs::{Fault, Model};
    use std::net::Ipv4Addr;

    const MSG: usize = 64 << 10;
    const IN_FLIGHT: usize = 4;

    /// What happened to a transfer.
    struct Outcome {
        sender: Option<NetError>,
        receiver: Option<NetError>,
        /// From the fault's injection to the last side's error.
        took: Duration,
        received: usize,
    }

    /// Sends `rounds` messages of [`MSG`] from a NIC on 127.0.4.`a` to one
    /// on 127.0.4.`b` (NCCL_IB_TIMEOUT=14: 67 ms, NCCL_IB_RETRY_CNT=2),
    /// injecting `fault` into the sender's (or the receiver's) NIC once
    /// `after` more frames have left it; checks every message received.
    fn transfer(a: u8, b: u8, fault: Option<(Fault, bool, u64)>, rounds: usize) -> Outcome {
        let secret = Secret::random();
        let config = IbConfig {
            timeout: 14,
            retry_cnt: 2,
            ..IbConfig::default()
        };
        let (ip_a, ip_b) = (Ipv4Addr::new(127, 0, 4, a), Ipv4Addr::new(127, 0, 4, b));
        let (x, y): (std::sync::Arc<Ib>, std::sync::Arc<Ib>) = (
            ib_on(ip_a, secret, config.clone()),
            ib_on(ip_b, secret, config),
        );
        let (mut send, mut recv) = connect(&*x, &*y);
        let mut out: Vec<u8> = (0..MSG * IN_FLIGHT).map(|i| (i * 7 + 3) as u8).collect();
        let mut into = vec![0u8; MSG * IN_FLIGHT];
        let send_mr = register(&*x, CommRef::Send(&send), &mut out);
        let recv_mr = register(&*y, CommRef::Recv(&recv), &mut into);
        let injected = Instant::now();
        if let Some((fault, on_sender, after)) = fault {
            let nic = Model::new(if on_sender { ip_a } else { ip_b }).unwrap();
            nic.inject(fault, after);
        }
        let (mut sends, mut recvs) = (
            std::collections::VecDeque::new(),
            std::collections::VecDeque::new(),
        );
        let (mut posted, mut received) = (0, 0);
        let (mut sender, mut receiver) = (None, None);
        let deadline = Instant::now() + DEADLINE;
        while (sender.is_none() || receiver.is_none()) && received < rounds {
            assert!(Instant::now() < deadline, "a fault went unnoticed (hang)");
            // A buffer takes a new receive only once its message is checked.
            while sender.is_none()
                && receiver.is_none()
                && posted < rounds
                && posted < received + IN_FLIGHT
            {
                let at = (posted % IN_FLIGHT) * MSG;
                let buffer = RecvBuffer::<Ib> {
                    data: into[at..].as_mut_ptr(),
                    size: MSG,
                    tag: 0,
                    mhandle: &recv_mr,
                };
                match y.irecv(&mut recv, &[buffer]) {
                    Ok(r) => recvs.push_back(r.unwrap()),
                    Err(e) => receiver = Some(e),
                }
                match x.isend(&mut send, out[at..].as_ptr(), MSG, 0, &send_mr) {
                    Ok(s) => sends.push_back(s.unwrap()),
                    Err(e) => sender = Some(e),
                }
                posted += 1;
            }
            if sender.is_none() {
                if let Some(s) = sends.front_mut() {
                    match x.test(s) {
                        Ok(Some(_)) => drop(sends.pop_front()),
                        Ok(None) => {}
                        Err(e) => sender = Some(e),
                    }
                }
            }
            if receiver.is_none() {
                if let Some(r) = recvs.front_mut() {
                    match y.test(r) {
                        Ok(Some(sizes)) => {
                            assert_eq!(sizes.as_slice(), [MSG]);
                            let at = (received % IN_FLIGHT) * MSG;
                            assert!(
                                into[at..at + MSG] == out[at..at + MSG],
                                "wrong data in message {received}"
                            );
                            into[at..at + MSG].fill(0);
                            recvs.pop_front();
                            received += 1;
                        }
                        Ok(None) => {}
                        Err(e) => receiver = Some(e),
                    }
                }
            }
            std::thread::yield_now();
        }
        for (err, peer) in [(&sender, send.peer()), (&receiver, recv.peer())] {
            if let Some(err) = err {
                assert!(
                    err.to_string().contains(&peer),
                    "{err} does not name {peer}"
                );
            }
        }
        Outcome {
            sender,
            receiver,
            took: injected.elapsed(),
            received,
        }
    }

    impl Outcome {
        /// Whether either side's error says `cause` (the side that saw
        /// it first; the other may only see the first close).
        fn names(&self, cause: &str) -> bool {
            [&self.sender, &self.receiver]
                .iter()
                .any(|err| err.as_ref().is_some_and(|e| e.to_string().contains(cause)))
        }
    }

    fn both_fail(outcome: &Outcome, what: &str) {
        let (Some(sender), Some(receiver)) = (&outcome.sender, &outcome.receiver) else {
            panic!(
                "{what}: sender {:?}, receiver {:?}",
                outcome.sender, outcome.receiver
            );
        };
        eprintln!(
            "{what}: both ends failed in {:?} after {} messages\n  sender: {sender}\n  receiver: {receiver}",
            outcome.took, outcome.received
        );
        assert!(outcome.took < DEADLINE);
    }

    #[test]
    fn no_fault_moves_every_message() {
        let outcome = transfer(1, 2, None, 64);
        assert!(outcome.sender.is_none() && outcome.receiver.is_none());
        assert_eq!(outcome.received, 64);
    }

    #[test]
    fn the_sender_port_going_down_fails_both_ends() {
        both_fail(
            &transfer(3, 4, Some((Fault::DropLink, true, 6)), 1000),
            "sender's port down",
        );
    }

    #[test]
    fn the_receiver_port_going_down_fails_both_ends() {
        both_fail(
            &transfer(5, 6, Some((Fault::DropLink, false, 6)), 1000),
            "receiver's port down",
        );
    }

    #[test]
    fn a_corrupted_key_fails_both_ends() {
        let outcome = transfer(7, 8, Some((Fault::CorruptKey, true, 6)), 1000);
        both_fail(&outcome, "corrupted key");
        assert!(outcome.names("remote access"));
    }

    #[test]
    fn a_stall_past_the_retries_fails_both_ends() {
        let outcome = transfer(
            9,
            10,
            Some((Fault::Stall(Duration::from_secs(3)), false, 6)),
            1000,
        );
        both_fail(&outcome, "receiver stalled 3 s");
        assert!(outcome.names("retry counter exceeded"));
        // After the retries (about 200 ms), not when the stall ends: the
        // side that fails tells the other at once.
        assert!(outcome.took < Duration::from_secs(1), "{:?}", outcome.took);
    }

    #[test]
    fn a_short_stall_loses_nothing() {
        let outcome = transfer(
            11,
            12,
            Some((Fault::Stall(Duration::from_millis(100)), false, 6)),
            64,
        );
        assert!(
            outcome.sender.is_none() && outcome.receiver.is_none(),
            "{:?} {:?}",
            outcome.sender,
            outcome.receiver
        );
        assert_eq!(outcome.received, 64);
    }
}
