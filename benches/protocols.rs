//! One protocol round trip between two threads: a piece goes from thread A
//! to thread B through one FIFO and straight back through another, for
//! each protocol (LL, LL128, Simple), with 8-byte and 4 KiB pieces. The
//! FIFOs live in a shared-memory segment, as between two ranks of a host.
//!
//! Run with `cargo bench --bench protocols`.

#![deny(unsafe_op_in_unsafe_fn)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use rccl_transports::{segment_bytes, ShmConnection, ShmSegment};
use rccl_transports::{Connection, FifoShape, Protocol, Tag};

const SHAPE: FifoShape = FifoShape {
    nslots: 8,
    slot_bytes: [8 << 10, 7680 * 8, 64 << 10],
};

/// Both ends of one connection, as two ranks would hold them.
fn connection_pair() -> (ShmConnection, ShmConnection) {
    let len = segment_bytes(&SHAPE);
    let created = ShmSegment::create(len).expect("segment");
    let opened = ShmSegment::open(created.name(), len).expect("map");
    opened.unlink().expect("unlink");
    (
        ShmConnection::new(created, true, &SHAPE),
        ShmConnection::new(opened, false, &SHAPE),
    )
}

/// Busy-waits (the measured path) with a deadline, so a bug cannot hang
/// the bench.
fn spin_until<T>(deadline: Instant, mut ready: impl FnMut() -> Option<T>) -> T {
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(Instant::now() < deadline, "round trip stalled");
        std::hint::spin_loop();
    }
}

fn send(conn: &ShmConnection, proto: Protocol, bytes: usize, deadline: Instant) {
    let fifo = conn.send_fifo(proto);
    let slot = spin_until(deadline, || fifo.try_reserve());
    // SAFETY: every slot of SHAPE holds at least 8 KiB.
    unsafe { std::ptr::write_bytes(slot, 7, bytes) };
    fifo.publish(bytes, Tag::default());
}

fn receive(conn: &ShmConnection, proto: Protocol, deadline: Instant) {
    let fifo = conn.recv_fifo(proto);
    spin_until(deadline, || fifo.try_peek());
    fifo.release();
}

fn round_trips(c: &mut Criterion) {
    let mut group = c.benchmark_group("protocol_round_trip");
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(300))
        .sample_size(20);
    for proto in Protocol::ALL {
        for bytes in [8usize, 4096] {
            let (a, b) = connection_pair();
            let b = Arc::new(b);
            let stop = Arc::new(AtomicBool::new(false));
            // The echo thread returns every piece it receives.
            let echo = {
                let (b, stop) = (b.clone(), stop.clone());
                std::thread::spawn(move || {
                    let fifo = b.recv_fifo(proto);
                    while !stop.load(Ordering::Relaxed) {
                        if fifo.try_peek().is_some() {
                            fifo.release();
                            send(&b, proto, bytes, Instant::now() + Duration::from_secs(10));
                        } else {
                            std::hint::spin_loop();
                        }
                    }
                })
            };
            group.bench_with_input(
                BenchmarkId::new(proto.name(), bytes),
                &bytes,
                |bench, &bytes| {
                    bench.iter(|| {
                        let deadline = Instant::now() + Duration::from_secs(10);
                        send(&a, proto, bytes, deadline);
                        receive(&a, proto, deadline);
                    })
                },
            );
            stop.store(true, Ordering::Relaxed);
            echo.join().expect("echo thread");
        }
    }
    group.finish();
}

criterion_group!(benches, round_trips);
criterion_main!(benches);
