//! The stream-ordered path on the emulated GPU, through the engine's API:
//! calls on device memory return before their peers arrive and complete
//! in stream order; groups over several communicators on shared streams;
//! refusals of mixed and host-path calls; work queued on an aborted
//! communicator ends with an error.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::gate;
use rccl::device::{self, Device, Kind, Stream};
use rccl::{CollCall, CollKind, Communicator, Config, DataType, RedOp};

fn emu() -> &'static dyn Device {
    device::select(Kind::Emu).unwrap()
}

fn config() -> Config {
    Config {
        timeout: Duration::from_secs(10),
        ..common::test_config()
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// `values` in a new device allocation.
fn on_device(values: &[f32]) -> *mut u8 {
    let dev = emu().alloc(values.len() * 4).unwrap();
    // SAFETY: both ranges hold values.len() floats.
    unsafe { emu().copy(dev, values.as_ptr().cast(), values.len() * 4) }.unwrap();
    dev
}

fn read_back(dev: *const u8, count: usize) -> Vec<f32> {
    let mut out = vec![0f32; count];
    // SAFETY: both ranges hold count floats.
    unsafe { emu().copy(out.as_mut_ptr().cast(), dev, count * 4) }.unwrap();
    out
}

fn all_reduce(count: usize) -> CollCall {
    CollCall {
        kind: CollKind::AllReduce,
        count,
        dtype: DataType::Float32,
        op: RedOp::Sum,
        root: 0,
    }
}

#[test]
fn a_call_returns_before_its_peers_arrive_and_completes_at_stream_synchronize() {
    let comms = Communicator::init_all_config(2, config()).unwrap();
    let count = 3000;
    let streams: Vec<Arc<dyn Stream>> = (0..2).map(|_| emu().create_stream().unwrap()).collect();
    let sends: Vec<*mut u8> = (0..2)
        .map(|r| on_device(&vec![r as f32 + 1.0; count]))
        .collect();
    let recvs: Vec<*mut u8> = (0..2).map(|_| on_device(&vec![0.0; count])).collect();
    // One thread issues rank 0's call, then rank 1's, outside any group:
    // had rank 0's call waited for its peer, it would never have returned
    // (it fails at its 10 s deadline instead).
    let started = Instant::now();
    // SAFETY: the device buffers hold `count` floats and live until the
    // streams are synchronized below.
    unsafe {
        comms[0]
            .collective_raw_on_stream(all_reduce(count), sends[0], recvs[0], streams[0].raw())
            .unwrap()
    };
    let returned = started.elapsed();
    let done = emu().create_event().unwrap();
    streams[0].record(done.as_ref()).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(!done.query(), "rank 0's call completed without its peer");
    assert!(
        returned < Duration::from_secs(2),
        "the call blocked for {returned:?}"
    );
    // SAFETY: as above.
    unsafe {
        comms[1]
            .collective_raw_on_stream(all_reduce(count), sends[1], recvs[1], streams[1].raw())
            .unwrap()
    };
    for (rank, stream) in streams.iter().enumerate() {
        stream.synchronize(soon()).unwrap();
        assert_eq!(read_back(recvs[rank], count), vec![3.0; count]);
    }
    assert!(done.query());
    for ptr in sends.into_iter().chain(recvs) {
        // SAFETY: the streams ran everything that used them.
        unsafe { emu().free(ptr) }.unwrap();
    }
}

#[test]
fn a_group_over_ranks_sharing_streams_does_not_deadlock() {
    let n = 4;
    let comms = Communicator::init_all_config(n, config()).unwrap();
    let count = 5000;
    let shared: Vec<Arc<dyn Stream>> = (0..2).map(|_| emu().create_stream().unwrap()).collect();
    let sends: Vec<*mut u8> = (0..n).map(|r| on_device(&vec![r as f32; count])).collect();
    let recvs: Vec<*mut u8> = (0..n).map(|_| on_device(&vec![0.0; count])).collect();
    // All ranks on the default stream, then ranks 0, 1 on one stream and
    // 2, 3 on another, each time driven from this one thread.
    for stream_of in [|_: usize| 0usize, |r: usize| r / 2 + 1] {
        rccl::group_start();
        for r in 0..n {
            let raw = match stream_of(r) {
                0 => 0,
                s => shared[s - 1].raw(),
            };
            // SAFETY: as in the test above.
            unsafe {
                comms[r]
                    .collective_raw_on_stream(all_reduce(count), sends[r], recvs[r], raw)
                    .unwrap()
            };
        }
        rccl::group_end().unwrap();
        emu().stream(0).unwrap().synchronize(soon()).unwrap();
        for stream in &shared {
            stream.synchronize(soon()).unwrap();
        }
        for &recv in &recvs {
            assert_eq!(read_back(recv, count), vec![6.0; count]);
        }
    }
    // Sends and receives in a ring, as one group on one stream.
    rccl::group_start();
    for r in 0..n {
        let raw = shared[0].raw();
        // SAFETY: as above.
        unsafe {
            comms[r]
                .send_raw_on_stream(sends[r], count, DataType::Float32, (r + 1) % n, raw)
                .unwrap();
            comms[r]
                .recv_raw_on_stream(recvs[r], count, DataType::Float32, (r + n - 1) % n, raw)
                .unwrap();
        }
    }
    rccl::group_end().unwrap();
    shared[0].synchronize(soon()).unwrap();
    for (r, &recv) in recvs.iter().enumerate() {
        assert_eq!(
            read_back(recv, count),
            vec![((r + n - 1) % n) as f32; count]
        );
    }
}

#[test]
fn a_call_mixing_host_and_device_buffers_is_refused_naming_each() {
    let comms = Communicator::init_all_config(1, config()).unwrap();
    let send = on_device(&[1.0; 8]);
    let mut host = [0f32; 8];
    // SAFETY: refused before anything runs.
    let err = unsafe {
        comms[0].collective_raw_on_stream(all_reduce(8), send, host.as_mut_ptr().cast(), 0)
    }
    .unwrap_err();
    assert_eq!(err.code(), 4, "ncclInvalidArgument: {err}");
    let text = err.to_string();
    assert!(
        text.contains("sendbuff")
            && text.contains("is device memory of emu device 0")
            && text.contains("recvbuff")
            && text.contains("is host memory"),
        "{text}"
    );
}

#[test]
fn a_host_call_on_device_memory_is_refused() {
    let comms = Communicator::init_all_config(1, config()).unwrap();
    let dev = on_device(&[1.0; 8]);
    // A slice over device memory: the typed calls run on the host.
    // SAFETY: the allocation holds 8 floats; the call refuses it unread.
    let slice = unsafe { std::slice::from_raw_parts_mut(dev.cast::<f32>(), 8) };
    let err = comms[0].all_reduce_in_place(slice, RedOp::Sum).unwrap_err();
    assert!(
        err.to_string().contains("is device memory of emu device 0"),
        "{err}"
    );
    // SAFETY: as above.
    let raw = unsafe { comms[0].collective_raw(all_reduce(8), dev, dev) }.unwrap_err();
    assert!(raw.to_string().contains("host-memory call"), "{raw}");
}

#[test]
fn work_queued_on_an_aborted_communicator_ends_with_an_error() {
    // Aborting drops queued work; destroying lets it complete first
    // (device_suite.rs).
    let count = 100;
    let comms = Communicator::init_all_config(2, config()).unwrap();
    let stream = emu().create_stream().unwrap();
    let open = gate(stream.as_ref());
    let send = on_device(&vec![1.0; count]);
    let recv = on_device(&vec![0.0; count]);
    // SAFETY: the buffers outlive the stream's work (synchronized below,
    // never freed).
    unsafe {
        comms[0]
            .collective_raw_on_stream(all_reduce(count), send, recv, stream.raw())
            .unwrap()
    };
    comms[0].abort();
    open.store(true, Ordering::Release);
    let started = Instant::now();
    stream.synchronize(soon()).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5), "it hung");
    let err = comms[0].async_error().expect("the queued call failed");
    assert!(err.to_string().contains("aborted"), "{err}");
    assert_eq!(read_back(recv, count), vec![0.0; count]);
}

#[test]
fn a_failure_in_flight_surfaces_through_async_error_and_the_next_call() {
    let comms = Communicator::init_all_config(2, config()).unwrap();
    let stream = emu().create_stream().unwrap();
    let send = on_device(&[1.0; 64]);
    let recv = on_device(&[0.0; 64]);
    // Rank 1 never calls: rank 0's launch waits on its stream until the
    // communicator is aborted from here.
    // SAFETY: the buffers are never freed.
    unsafe {
        comms[0]
            .collective_raw_on_stream(all_reduce(64), send, recv, stream.raw())
            .unwrap()
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(comms[0].async_error().is_none());
    comms[0].abort();
    stream.synchronize(soon()).unwrap();
    assert!(comms[0].async_error().is_some());
    // SAFETY: refused before anything runs.
    let next =
        unsafe { comms[0].collective_raw_on_stream(all_reduce(64), send, recv, stream.raw()) };
    assert!(next.unwrap_err().to_string().contains("aborted"));
}

#[test]
fn a_communicators_calls_on_different_streams_run_in_issue_order() {
    let comms = Communicator::init_all_config(2, config()).unwrap();
    let count = 256;
    let first: Vec<Arc<dyn Stream>> = (0..2).map(|_| emu().create_stream().unwrap()).collect();
    let second: Vec<Arc<dyn Stream>> = (0..2).map(|_| emu().create_stream().unwrap()).collect();
    let gates: Vec<_> = first.iter().map(|s| gate(s.as_ref())).collect();
    let send: Vec<*mut u8> = (0..2).map(|_| on_device(&vec![1.0; count])).collect();
    let mid: Vec<*mut u8> = (0..2).map(|_| on_device(&vec![0.0; count])).collect();
    let out: Vec<*mut u8> = (0..2).map(|_| on_device(&vec![0.0; count])).collect();
    // send -> mid on the held streams, then mid -> out on free ones: the
    // second call must still wait for the first.
    for r in 0..2 {
        // SAFETY: the buffers are never freed.
        unsafe {
            comms[r]
                .collective_raw_on_stream(all_reduce(count), send[r], mid[r], first[r].raw())
                .unwrap()
        };
    }
    for r in 0..2 {
        // SAFETY: as above.
        unsafe {
            comms[r]
                .collective_raw_on_stream(all_reduce(count), mid[r], out[r], second[r].raw())
                .unwrap()
        };
    }
    std::thread::sleep(Duration::from_millis(50));
    for open in &gates {
        open.store(true, Ordering::Release);
    }
    for stream in first.iter().chain(&second) {
        stream.synchronize(soon()).unwrap();
    }
    for &dev in &out {
        assert_eq!(read_back(dev, count), vec![4.0; count]);
    }
}

#[test]
fn finalize_and_host_calls_wait_for_work_queued_on_streams() {
    let comms = Communicator::init_all_config(2, config()).unwrap();
    let count = 256;
    let streams: Vec<Arc<dyn Stream>> = (0..2).map(|_| emu().create_stream().unwrap()).collect();
    let gates: Vec<_> = streams.iter().map(|s| gate(s.as_ref())).collect();
    let send: Vec<*mut u8> = (0..2).map(|_| on_device(&vec![1.0; count])).collect();
    let recv: Vec<*mut u8> = (0..2).map(|_| on_device(&vec![0.0; count])).collect();
    for r in 0..2 {
        // SAFETY: the buffers are never freed.
        unsafe {
            comms[r]
                .collective_raw_on_stream(all_reduce(count), send[r], recv[r], streams[r].raw())
                .unwrap()
        };
    }
    // Addresses cross into the threads as integers.
    let recv: Vec<usize> = recv.into_iter().map(|p| p as usize).collect();
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(50));
            for open in &gates {
                open.store(true, Ordering::Release);
            }
        });
        // Rank 0 finalizes, rank 1 makes a host call (its peer's half of
        // which rank 0 makes after finalizing): each returns only once the
        // queued all-reduce has run.
        s.spawn(|| {
            comms[0].finalize().unwrap();
            assert_eq!(read_back(recv[0] as *const u8, count), vec![2.0; count]);
            let mut host = [1f32; 4];
            comms[0].all_reduce_in_place(&mut host, RedOp::Sum).unwrap();
        });
        let mut host = [1f32; 4];
        comms[1].all_reduce_in_place(&mut host, RedOp::Sum).unwrap();
        assert_eq!(read_back(recv[1] as *const u8, count), vec![2.0; count]);
        assert_eq!(host, [2.0; 4]);
    });
}

#[test]
fn a_group_mixing_host_and_device_calls_is_refused() {
    let comms = Communicator::init_all_config(1, config()).unwrap();
    let dev = on_device(&[1.0; 8]);
    let mut host = [1f32; 8];
    rccl::group_start();
    // SAFETY: the group is refused before anything runs.
    unsafe {
        comms[0]
            .collective_raw_on_stream(all_reduce(8), dev, dev, 0)
            .unwrap();
        comms[0]
            .collective_raw_on_stream(
                all_reduce(8),
                host.as_ptr().cast(),
                host.as_mut_ptr().cast(),
                0,
            )
            .unwrap();
    }
    let err = rccl::group_end().unwrap_err();
    assert_eq!(err.code(), 4, "{err}");
    assert!(
        err.to_string().contains("mixes calls on host memory"),
        "{err}"
    );
}

#[test]
fn device_work_whose_peer_never_comes_fails_at_the_timeout() {
    let comms = Communicator::init_all_config(
        2,
        Config {
            timeout: Duration::from_millis(300),
            ..config()
        },
    )
    .unwrap();
    let stream = emu().create_stream().unwrap();
    let send = on_device(&[1.0; 64]);
    let recv = on_device(&[0.0; 64]);
    let started = Instant::now();
    // Rank 1 never calls.
    // SAFETY: the buffers are never freed.
    unsafe {
        comms[0]
            .collective_raw_on_stream(all_reduce(64), send, recv, stream.raw())
            .unwrap()
    };
    stream.synchronize(soon()).unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    let err = comms[0]
        .async_error()
        .expect("the launch failed")
        .to_string();
    assert!(
        err.contains("rank 0 of 2: device work timed out after 300ms in operation #0 on channel ")
            && err.contains(", waiting for data from rank 1 (host "),
        "{err}"
    );
}
