//! The verbs model's behaviours one by one: ordering, receiver-not-ready,
//! keys and bounds, overflow, timeouts, sequence-number wrap, faults.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use super::*;
use crate::verbs::Sge;

#[test]
fn faults_parse() {
    assert_eq!(Fault::parse("drop:3"), Ok((Fault::DropLink, 3)));
    assert_eq!(Fault::parse("corrupt:0"), Ok((Fault::CorruptKey, 0)));
    assert_eq!(
        Fault::parse("stall:2:150"),
        Ok((Fault::Stall(Duration::from_millis(150)), 2))
    );
    for bad in ["drop", "stall:1", "fry:1", "drop:1:2"] {
        assert!(Fault::parse(bad).is_err(), "{bad}");
    }
}

/// One end of a model connection: its queue pair and completion queue,
/// and a registered buffer.
struct End {
    // Dropped in this order: the queue pair and the region before the
    // buffer.
    qp: Box<dyn QueuePair>,
    cq: Arc<dyn CompletionQueue>,
    mr: Box<dyn MemoryRegion>,
    buf: Box<[u8]>,
    _device: Arc<dyn Device>,
}

fn path(timeout: u8, retry_cnt: u8, rnr_retry: u8) -> PathSettings {
    PathSettings {
        port: 1,
        is_global: true,
        sgid_index: 3,
        sl: 0,
        traffic_class: 0,
        timeout,
        retry_cnt,
        rnr_retry,
        access: ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
    }
}

fn end(model: &Model, cq_depth: u32, len: usize) -> End {
    let device = model.open(0).unwrap();
    let cq = device.create_cq(cq_depth).unwrap();
    let caps = QpCaps {
        max_send_wr: 64,
        max_recv_wr: 64,
        max_inline: 64,
    };
    let qp = device.create_qp(&cq, caps).unwrap();
    let mut buf = vec![0u8; len].into_boxed_slice();
    // SAFETY: the buffer lives in the End, which drops the region first.
    let mr = unsafe {
        device.reg_mr(
            buf.as_mut_ptr(),
            len,
            ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE,
        )
    }
    .unwrap();
    End {
        qp,
        cq,
        mr,
        buf,
        _device: device,
    }
}

/// Two ends on the NICs of `a` and `b`, connected both ways.
fn connected(a: &Model, b: &Model, settings: PathSettings, cq_depth: u32) -> (End, End) {
    connected_from(a, b, settings, cq_depth, 100)
}

/// As [`connected`], each side's packet sequence numbers starting at
/// `psn`.
fn connected_from(
    a: &Model,
    b: &Model,
    settings: PathSettings,
    cq_depth: u32,
    psn: u32,
) -> (End, End) {
    let (x, y) = (end(a, cq_depth, 4096), end(b, cq_depth, 4096));
    let gid = |m: &Model| m.devices()[0].ports[0].gids[3].gid;
    for (this, that, model) in [(&x, &y, b), (&y, &x, a)] {
        this.qp.init(&settings).unwrap();
        let remote = RemoteQp {
            qpn: that.qp.qpn(),
            psn,
            lid: 0,
            gid: gid(model),
            mtu: 5,
        };
        this.qp.ready_to_receive(&remote, &settings).unwrap();
        this.qp.ready_to_send(psn, &settings).unwrap();
    }
    (x, y)
}

fn model(last: u8) -> Model {
    Model::new(Ipv4Addr::new(127, 0, 3, last)).unwrap()
}

/// Polls until `n` completions arrived (or the deadline).
fn completions(cq: &Arc<dyn CompletionQueue>, n: usize) -> Vec<Wc> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    let mut batch = [Wc {
        wr_id: 0,
        status: WcStatus::Success,
        opcode: WcOpcode::Send,
        byte_len: 0,
        imm: None,
        qp_num: 0,
    }; 16];
    while out.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} completions: {out:?}",
            out.len()
        );
        let got = cq.poll(&mut batch).unwrap();
        out.extend_from_slice(&batch[..got]);
        if got == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    out
}

fn write(from: &End, to: &End, at: usize, len: usize, imm: Option<u32>, wr_id: u64) -> SendWr {
    SendWr {
        wr_id,
        sge: Some(Sge {
            addr: from.buf.as_ptr() as u64 + at as u64,
            len: len as u32,
            lkey: from.mr.lkey(),
        }),
        op: SendOp::Write {
            remote_addr: to.buf.as_ptr() as u64 + at as u64,
            rkey: to.mr.rkey(),
            imm,
        },
        signaled: true,
        inline: false,
    }
}

fn recv(wr_id: u64) -> RecvWr {
    RecvWr { wr_id, sge: None }
}

#[test]
fn writes_with_immediate_arrive_in_order_and_consume_receives() {
    let (a, b) = (model(1), model(2));
    let (mut x, y) = connected(&a, &b, path(14, 7, 7), 256);
    for (i, byte) in x.buf.iter_mut().enumerate() {
        *byte = (i * 7) as u8;
    }
    y.qp.post_recv(&(0..8).map(recv).collect::<Vec<_>>())
        .unwrap();
    let wrs: Vec<SendWr> = (0..8)
        .map(|i| write(&x, &y, i * 512, 512, Some(1000 + i as u32), i as u64))
        .collect();
    x.qp.post_send(&wrs).unwrap();
    let sent = completions(&x.cq, 8);
    assert!(sent.iter().all(|wc| wc.status == WcStatus::Success));
    let got = completions(&y.cq, 8);
    for (i, wc) in got.iter().enumerate() {
        assert_eq!(
            (wc.wr_id, wc.imm, wc.byte_len),
            (i as u64, Some(1000 + i as u32), 512)
        );
        assert_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
    }
    assert_eq!(x.buf, y.buf);
}

#[test]
fn a_write_with_immediate_and_no_receive_is_receiver_not_ready() {
    let (a, b) = (model(3), model(4));
    // Three RNR retries: the sender gives up.
    let (x, y) = connected(&a, &b, path(14, 7, 3), 64);
    x.qp.post_send(&[write(&x, &y, 0, 64, Some(1), 9)]).unwrap();
    let wc = completions(&x.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (9, WcStatus::RnrRetryExceeded));
    // Retrying without end (7): a receive posted later takes it.
    let (x, y) = connected(&a, &b, path(14, 7, 7), 64);
    x.qp.post_send(&[write(&x, &y, 0, 64, Some(2), 1)]).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    y.qp.post_recv(&[recv(5)]).unwrap();
    assert_eq!(completions(&x.cq, 1)[0].status, WcStatus::Success);
    assert_eq!(completions(&y.cq, 1)[0].imm, Some(2));
}

#[test]
fn a_bad_key_or_bounds_is_a_remote_access_error_that_flushes_both_sides() {
    let (a, b) = (model(5), model(6));
    for bounds in [false, true] {
        let (x, y) = connected(&a, &b, path(14, 7, 7), 64);
        y.qp.post_recv(&[recv(1), recv(2)]).unwrap();
        let mut bad = write(&x, &y, 0, 64, Some(1), 7);
        if let SendOp::Write {
            rkey, remote_addr, ..
        } = &mut bad.op
        {
            if bounds {
                *remote_addr += 4096 - 32;
            } else {
                *rkey ^= 1;
            }
        }
        let after = write(&x, &y, 0, 8, None, 8);
        x.qp.post_send(&[bad, after]).unwrap();
        let sent = completions(&x.cq, 2);
        assert_eq!((sent[0].wr_id, sent[0].status), (7, WcStatus::RemoteAccess));
        assert_eq!((sent[1].wr_id, sent[1].status), (8, WcStatus::Flush));
        let flushed = completions(&y.cq, 2);
        assert!(
            flushed.iter().all(|wc| wc.status == WcStatus::Flush),
            "{flushed:?}"
        );
        assert!(y.qp.async_error().unwrap().contains("QP_ACCESS_ERR"));
        // A queue pair in error flushes what is posted later.
        x.qp.post_send(&[write(&x, &y, 0, 8, None, 11)]).unwrap();
        assert_eq!(completions(&x.cq, 1)[0].status, WcStatus::Flush);
    }
}

#[test]
fn a_completion_queue_overflows() {
    let (a, b) = (model(7), model(8));
    let (x, y) = connected(&a, &b, path(14, 7, 7), 2);
    let wrs: Vec<SendWr> = (0..4).map(|i| write(&x, &y, 0, 8, None, i)).collect();
    x.qp.post_send(&wrs).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        assert!(Instant::now() < deadline, "no overflow");
        std::thread::sleep(Duration::from_millis(5));
        if x.qp.async_error().is_some() {
            break x.cq.poll(&mut []).unwrap_err();
        }
    };
    assert!(err.message.contains("overflowed"), "{err}");
    assert!(x.qp.async_error().unwrap().contains("CQ_ERR"));
}

#[test]
fn unanswered_frames_time_out_after_the_retries() {
    let (a, b) = (model(9), model(10));
    // timeout 14: 67 ms per try; 2 retries: about 200 ms.
    let (x, y) = connected(&a, &b, path(14, 2, 7), 64);
    b.inject(Fault::Stall(Duration::from_secs(2)), 0);
    // The stall starts when b sends its next frame.
    let sent = b.frames_sent();
    y.qp.post_send(&[write(&y, &x, 0, 8, None, 1)]).unwrap();
    while b.frames_sent() == sent {
        std::thread::sleep(Duration::from_millis(1));
    }
    let start = Instant::now();
    x.qp.post_send(&[write(&x, &y, 0, 8, None, 2)]).unwrap();
    let wc = completions(&x.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RetryExceeded));
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(150) && took < Duration::from_secs(2),
        "{took:?}"
    );
}

/// Packet sequence numbers are 24 bits: the ones after 0xff_ffff start
/// again at 0 (the provider starts each queue pair at a random one, so a
/// busy connection gets there). A responder that counted on to 2^24
/// took every later frame for a duplicate: it acknowledged the frame
/// without delivering it, so the sender saw its writes complete and the
/// receiver never saw them.
#[test]
fn writes_across_the_sequence_number_wrap_all_arrive() {
    let (a, b) = (model(21), model(22));
    let (mut x, y) = connected_from(&a, &b, path(14, 7, 7), 256, 0xff_fffc);
    for (i, byte) in x.buf.iter_mut().enumerate() {
        *byte = (i * 11) as u8;
    }
    y.qp.post_recv(&(0..8).map(recv).collect::<Vec<_>>())
        .unwrap();
    let wrs: Vec<SendWr> = (0..8)
        .map(|i| write(&x, &y, i * 512, 512, Some(i as u32), i as u64))
        .collect();
    x.qp.post_send(&wrs).unwrap();
    assert!(completions(&x.cq, 8)
        .iter()
        .all(|wc| wc.status == WcStatus::Success));
    let imms: Vec<_> = completions(&y.cq, 8).iter().map(|wc| wc.imm).collect();
    assert_eq!(imms, (0..8).map(Some).collect::<Vec<_>>());
    assert_eq!(x.buf, y.buf);
}

/// Frames sent again across the wrap: the responder drops the
/// duplicates of frames before 0 and takes those after.
#[test]
fn frames_sent_again_across_the_sequence_number_wrap_land_once() {
    let (a, b) = (model(23), model(24));
    let (mut x, y) = connected_from(&a, &b, path(12, 7, 7), 256, 0xff_fffe);
    for (i, byte) in x.buf.iter_mut().enumerate() {
        *byte = (i * 17) as u8;
    }
    // b stalls from its next frame: a's four frames (0xff_fffe to 1) are
    // sent again until b reads, and b reads them more than once.
    b.inject(Fault::Stall(Duration::from_millis(100)), 0);
    let sent = b.frames_sent();
    y.qp.post_send(&[write(&y, &x, 4000, 8, None, 1)]).unwrap();
    while b.frames_sent() == sent {
        std::thread::sleep(Duration::from_millis(1));
    }
    y.qp.post_recv(&(0..4).map(recv).collect::<Vec<_>>())
        .unwrap();
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| write(&x, &y, i * 1000, 1000, Some(i as u32), i as u64))
        .collect();
    x.qp.post_send(&wrs).unwrap();
    assert!(completions(&x.cq, 4)
        .iter()
        .all(|wc| wc.status == WcStatus::Success));
    let got = completions(&y.cq, 5);
    let imms: Vec<_> = got.iter().filter_map(|wc| wc.imm).collect();
    assert_eq!(imms, [0, 1, 2, 3]);
    assert_eq!(x.buf[..4000], y.buf[..4000]);
}

#[test]
fn a_short_stall_loses_nothing() {
    let (a, b) = (model(11), model(12));
    let (mut x, y) = connected(&a, &b, path(12, 7, 7), 256);
    for (i, byte) in x.buf.iter_mut().enumerate() {
        *byte = (i * 13) as u8;
    }
    // b stalls 100 ms from its next frame; a's frames are sent again
    // (every 17 ms) and duplicates are dropped.
    b.inject(Fault::Stall(Duration::from_millis(100)), 0);
    let sent = b.frames_sent();
    y.qp.post_send(&[write(&y, &x, 4000, 8, None, 1)]).unwrap();
    while b.frames_sent() == sent {
        std::thread::sleep(Duration::from_millis(1));
    }
    y.qp.post_recv(&(0..4).map(recv).collect::<Vec<_>>())
        .unwrap();
    let wrs: Vec<SendWr> = (0..4)
        .map(|i| write(&x, &y, i * 1000, 1000, Some(i as u32), i as u64))
        .collect();
    x.qp.post_send(&wrs).unwrap();
    assert!(completions(&x.cq, 4)
        .iter()
        .all(|wc| wc.status == WcStatus::Success));
    let got = completions(&y.cq, 5);
    let imms: Vec<_> = got.iter().filter_map(|wc| wc.imm).collect();
    assert_eq!(imms, [0, 1, 2, 3]);
    assert_eq!(x.buf[..4000], y.buf[..4000]);
}

#[test]
fn a_dropped_link_fails_both_ends() {
    let (a, b) = (model(13), model(14));
    let (x, y) = connected(&a, &b, path(14, 2, 7), 64);
    y.qp.post_recv(&[recv(1)]).unwrap();
    a.inject(Fault::DropLink, 0);
    x.qp.post_send(&[write(&x, &y, 0, 8, Some(1), 1)]).unwrap();
    let wc = completions(&x.cq, 1)[0];
    assert_eq!(wc.status, WcStatus::RetryExceeded);
    assert!(a
        .open(0)
        .unwrap()
        .async_error()
        .unwrap()
        .contains("PORT_ERR"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while y.qp.async_error().is_none() {
        assert!(
            Instant::now() < deadline,
            "the far end never saw the link go"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(y.qp.async_error().unwrap().contains("went down"));
    assert_eq!(completions(&y.cq, 1)[0].status, WcStatus::Flush);
}

#[test]
fn a_corrupted_key_is_caught() {
    let (a, b) = (model(15), model(16));
    let (x, y) = connected(&a, &b, path(14, 7, 7), 64);
    y.qp.post_recv(&[recv(1)]).unwrap();
    a.inject(Fault::CorruptKey, 0);
    x.qp.post_send(&[write(&x, &y, 0, 8, Some(1), 1)]).unwrap();
    assert_eq!(completions(&x.cq, 1)[0].status, WcStatus::RemoteAccess);
    assert_eq!(completions(&y.cq, 1)[0].status, WcStatus::Flush);
}

#[test]
fn sends_land_in_posted_receive_buffers() {
    let (a, b) = (model(17), model(18));
    let (mut x, y) = connected(&a, &b, path(14, 7, 7), 64);
    x.buf[..5].copy_from_slice(b"hello");
    let room = Sge {
        addr: y.buf.as_ptr() as u64 + 100,
        len: 16,
        lkey: y.mr.lkey(),
    };
    y.qp.post_recv(&[RecvWr {
        wr_id: 3,
        sge: Some(room),
    }])
    .unwrap();
    let send = SendWr {
        wr_id: 4,
        sge: Some(Sge {
            addr: x.buf.as_ptr() as u64,
            len: 5,
            lkey: x.mr.lkey(),
        }),
        op: SendOp::Send,
        signaled: true,
        inline: true,
    };
    x.qp.post_send(&[send]).unwrap();
    assert_eq!(completions(&x.cq, 1)[0].status, WcStatus::Success);
    let wc = completions(&y.cq, 1)[0];
    assert_eq!((wc.wr_id, wc.opcode, wc.byte_len), (3, WcOpcode::Recv, 5));
    assert_eq!(&y.buf[100..105], b"hello");
    // A send larger than the buffer is a length error.
    y.qp.post_recv(&[RecvWr {
        wr_id: 5,
        sge: Some(Sge { len: 2, ..room }),
    }])
    .unwrap();
    x.qp.post_send(&[SendWr { wr_id: 6, ..send }]).unwrap();
    assert_eq!(completions(&y.cq, 1)[0].status, WcStatus::LocalLength);
    assert_ne!(completions(&x.cq, 1)[0].status, WcStatus::Success);
}

/// Whether `fd` turns readable within `ms` milliseconds.
fn readable(fd: std::os::fd::RawFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a count of 1.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

#[test]
fn an_armed_completion_queue_raises_its_event() {
    let (a, b) = (model(19), model(20));
    let (x, y) = connected(&a, &b, path(14, 7, 7), 64);
    y.cq.arm().unwrap();
    let fd = y.cq.event_fd();
    assert!(!readable(fd, 0));
    y.qp.post_recv(&[recv(1)]).unwrap();
    x.qp.post_send(&[write(&x, &y, 0, 8, Some(1), 1)]).unwrap();
    assert!(readable(fd, 5_000), "no event for a completion");
    y.cq.arm().unwrap();
    assert!(!readable(fd, 0), "arming did not consume the event");
    assert_eq!(completions(&y.cq, 1)[0].imm, Some(1));
}
