use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::device;
use crate::{Device, Memory, Stream};

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

#[test]
fn device_memory_is_classified_and_host_memory_is_not() {
    let emu = device();
    let ptr = emu.alloc(1000).unwrap();
    let device_memory = Memory::Device {
        backend: "emu",
        index: 0,
    };
    assert_eq!(emu.classify(ptr).unwrap(), device_memory);
    // SAFETY: inside the 1000 bytes.
    let last = unsafe { ptr.add(999) };
    assert_eq!(emu.classify(last).unwrap(), device_memory);
    let host = [0u8; 16];
    assert_eq!(emu.classify(host.as_ptr()).unwrap(), Memory::Host);
    assert_eq!(
        device_memory.to_string(),
        "device memory of emu device 0",
        "the engine's messages quote this"
    );
    // SAFETY: allocated above, no work uses it.
    unsafe { emu.free(ptr).unwrap() };
    assert_eq!(emu.classify(ptr).unwrap(), Memory::Host);
    // SAFETY: freeing twice is refused, not undefined.
    let again = unsafe { emu.free(ptr) };
    assert!(again.unwrap_err().to_string().contains("not an allocation"));
}

#[test]
fn copies_move_bytes_and_refuse_to_run_past_an_allocation() {
    let emu = device();
    let dev = emu.alloc(64).unwrap();
    let src: Vec<u8> = (0..64).collect();
    let mut back = vec![0u8; 64];
    // SAFETY: all ranges are 64 bytes of live memory.
    unsafe {
        emu.copy(dev, src.as_ptr(), 64).unwrap();
        emu.copy(back.as_mut_ptr(), dev, 64).unwrap();
    }
    assert_eq!(back, src);
    // SAFETY: refused before any byte moves.
    let past = unsafe { emu.copy(back.as_mut_ptr(), dev.add(32), 64) };
    assert!(past.unwrap_err().to_string().contains("runs past"));
    // SAFETY: allocated above.
    unsafe { emu.free(dev).unwrap() };
}

#[test]
fn a_stream_runs_its_work_in_order_and_synchronize_waits_for_it() {
    let emu = device();
    let stream = emu.create_stream().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    for i in 0..100 {
        let seen = seen.clone();
        stream
            .enqueue(Box::new(move || {
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(50));
                }
                seen.lock().push(i)
            }))
            .unwrap();
    }
    // The first entry sleeps: the call returned long before the work ran.
    assert!(seen.lock().len() < 100);
    stream.synchronize(soon()).unwrap();
    assert_eq!(*seen.lock(), (0..100).collect::<Vec<_>>());
    emu.destroy_stream(stream.raw()).unwrap();
    assert!(emu.stream(stream.raw()).is_err());
}

#[test]
fn synchronize_reports_work_still_running_at_its_deadline() {
    let emu = device();
    let stream = emu.create_stream().unwrap();
    stream
        .enqueue(Box::new(|| std::thread::sleep(Duration::from_millis(300))))
        .unwrap();
    let err = stream
        .synchronize(Instant::now() + Duration::from_millis(20))
        .unwrap_err();
    assert!(err.to_string().contains("still runs"), "{err}");
    stream.synchronize(soon()).unwrap();
}

#[test]
fn an_event_orders_one_stream_after_another() {
    let emu = device();
    let (first, second) = (emu.create_stream().unwrap(), emu.create_stream().unwrap());
    let event = emu.create_event().unwrap();
    assert!(event.query(), "an event never recorded is complete");
    let step = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(AtomicUsize::new(0));
    {
        let (step, gate) = (step.clone(), gate.clone());
        first
            .enqueue(Box::new(move || {
                while gate.load(Ordering::Acquire) == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                step.store(1, Ordering::Release);
            }))
            .unwrap();
    }
    first.record(event.as_ref()).unwrap();
    assert!(!event.query());
    second.wait_event(event.as_ref()).unwrap();
    let after = Arc::new(AtomicUsize::new(usize::MAX));
    {
        let (step, after) = (step.clone(), after.clone());
        second
            .enqueue(Box::new(move || {
                after.store(step.load(Ordering::Acquire), Ordering::Release)
            }))
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(
        after.load(Ordering::Acquire),
        usize::MAX,
        "ran before the event"
    );
    gate.store(1, Ordering::Release);
    second.synchronize(soon()).unwrap();
    assert_eq!(after.load(Ordering::Acquire), 1);
    event.synchronize(soon()).unwrap();
    assert!(event.query());
}

#[test]
fn a_joint_task_runs_once_after_every_stream_reached_it() {
    let emu = device();
    let streams: Vec<Arc<dyn Stream>> = (0..3).map(|_| emu.create_stream().unwrap()).collect();
    let log = Arc::new(Mutex::new(Vec::new()));
    for (i, stream) in streams.iter().enumerate() {
        let log = log.clone();
        stream
            .enqueue(Box::new(move || {
                std::thread::sleep(Duration::from_millis(10 * i as u64));
                log.lock().push(format!("before {i}"));
            }))
            .unwrap();
    }
    // Streams named twice count once.
    let mut involved = streams.clone();
    involved.push(streams[1].clone());
    let joint_log = log.clone();
    emu.enqueue_joint(
        &involved,
        Box::new(move || joint_log.lock().push("joint".into())),
    )
    .unwrap();
    for (i, stream) in streams.iter().enumerate() {
        let log = log.clone();
        stream
            .enqueue(Box::new(move || log.lock().push(format!("after {i}"))))
            .unwrap();
    }
    for stream in &streams {
        stream.synchronize(soon()).unwrap();
    }
    let log = log.lock();
    let joint = log.iter().position(|e| e == "joint").unwrap();
    assert_eq!(log.iter().filter(|e| *e == "joint").count(), 1);
    assert!(
        log[..joint].iter().all(|e| e.starts_with("before")),
        "{log:?}"
    );
    assert!(
        log[joint + 1..].iter().all(|e| e.starts_with("after")),
        "{log:?}"
    );
}

#[test]
fn joint_tasks_sharing_streams_do_not_deadlock() {
    let emu = device();
    let (a, b) = (emu.create_stream().unwrap(), emu.create_stream().unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    std::thread::scope(|s| {
        for flip in [false, true] {
            let (a, b, runs) = (a.clone(), b.clone(), runs.clone());
            s.spawn(move || {
                for _ in 0..50 {
                    let pair = if flip {
                        [b.clone(), a.clone()]
                    } else {
                        [a.clone(), b.clone()]
                    };
                    let runs = runs.clone();
                    emu.enqueue_joint(
                        &pair,
                        Box::new(move || {
                            runs.fetch_add(1, Ordering::Relaxed);
                        }),
                    )
                    .unwrap();
                }
            });
        }
    });
    a.synchronize(soon()).unwrap();
    b.synchronize(soon()).unwrap();
    assert_eq!(runs.load(Ordering::Relaxed), 100);
}

#[test]
fn unknown_streams_are_refused_and_the_default_stream_is_there() {
    let emu = device();
    let err = emu.stream(0xdead_0000).err().unwrap();
    assert!(
        err.to_string().contains("not a stream of emu device 0"),
        "{err}"
    );
    let default = emu.stream(0).unwrap();
    assert_eq!(default.raw(), 0);
    default.synchronize(soon()).unwrap();
    assert!(emu.destroy_stream(0).is_err());
}

#[test]
fn a_wait_on_an_event_never_reached_ends_at_its_deadline_with_an_error() {
    let emu = device();
    let (first, second) = (emu.create_stream().unwrap(), emu.create_stream().unwrap());
    let event = super::EmuEvent::new(Duration::from_millis(30));
    let gate = Arc::new(AtomicUsize::new(0));
    let theirs = gate.clone();
    first
        .enqueue(Box::new(move || {
            let until = Instant::now() + Duration::from_secs(20);
            while theirs.load(Ordering::Acquire) == 0 && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }))
        .unwrap();
    first.record(&event).unwrap();
    second.wait_event(&event).unwrap();
    let err = second.synchronize(soon()).unwrap_err();
    assert!(err.to_string().contains("never reached"), "{err}");
    gate.store(1, Ordering::Release);
    first.synchronize(soon()).unwrap();
}

/// This process's open memfds of shareable emu memory.
fn own_memfds() -> usize {
    let name = format!("/memfd:{}", super::memfd_name(std::process::id()));
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|link| link.to_string_lossy().starts_with(&name))
        .count()
}

#[test]
fn shareable_memory_is_exported_as_a_file_another_process_reads_and_not_reopened_here() {
    let emu = device();
    let before = own_memfds();
    let ptr = emu.alloc_shareable(5000).unwrap();
    assert!(emu.classify(ptr).unwrap().is_device());
    // SAFETY: inside the 5000 zeroed bytes just allocated.
    unsafe {
        assert_eq!(ptr.add(4999).read(), 0);
        ptr.copy_from_nonoverlapping(b"shared".as_ptr(), 6);
    }
    let (handle, len) = emu.export(ptr).unwrap();
    assert_eq!(len, 5000);
    // Another process sees the bytes through the handle.
    let seen = std::process::Command::new("head")
        .args(["-c", "6"])
        .stdin(std::process::Stdio::from(handle.try_clone().unwrap()))
        .output()
        .unwrap();
    assert_eq!(seen.stdout, b"shared");
    // As CUDA's: the exporting process cannot open its own handle.
    let own = emu.import(handle, 5000).unwrap_err();
    assert!(own.to_string().contains("exported itself"), "{own}");
    // Nothing else is taken for an export.
    let host = emu.alloc(64).unwrap();
    assert!(emu.export(host).is_err());
    let pipe = std::process::Command::new("true")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
        .stdout
        .take()
        .unwrap();
    let foreign = emu.import(std::os::fd::OwnedFd::from(pipe), 64);
    assert!(foreign
        .unwrap_err()
        .to_string()
        .contains("not emu device memory"));
    // SAFETY: allocated above; no work uses them.
    unsafe {
        emu.free(host).unwrap();
        emu.free(ptr).unwrap();
    }
    assert_eq!(own_memfds(), before, "free closes the allocation's memfd");
}
