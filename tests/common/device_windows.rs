//! Windows of device memory in the one-sided tests (the emulated GPU's,
//! the CUDA backend's over the driver model): buffers on the active
//! device and a ring of puts on streams, its data checked
//! (included with `#[path]`).

// Each test binary uses part of this.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rccl::{Communicator, WaitDesc};

/// What rank `rank` puts in round `round`: `bytes` bytes.
pub fn payload(rank: usize, round: usize, bytes: usize) -> Vec<u8> {
    (0..bytes)
        .map(|i| (i * 31 + rank * 7 + round * 13) as u8)
        .collect()
}

pub const DATA: usize = 0;
pub const ACK: usize = 1;

/// NCCL_WIN_REQUIRED_ALIGNMENT.
const ALIGN: usize = 4096;

/// How a test's window memory is allocated on the device.
#[derive(Clone, Copy, PartialEq)]
pub enum Alloc {
    /// `alloc`: reached by ranks of this process only.
    Plain,
    /// `alloc_shareable` (`ncclMemAlloc`): mapped by other processes too.
    Shareable,
}

/// Device memory of `len` bytes and a stream, freed on drop.
pub struct DeviceBuffers {
    pub device: &'static dyn rccl::device::Device,
    /// `len` zeroed bytes at a multiple of [`ALIGN`] in `allocation`.
    pub window: *mut u8,
    allocation: *mut u8,
    pub source: *mut u8,
    pub stream: std::sync::Arc<dyn rccl::device::Stream>,
}

impl DeviceBuffers {
    pub fn new(len: usize, alloc: Alloc) -> DeviceBuffers {
        let device = rccl::device::active().expect("a device (RCCL_DEVICE)");
        // The CUDA backend's plain allocations need not start on a page.
        let allocation = match alloc {
            Alloc::Plain => device.alloc_zeroed(len + ALIGN).unwrap(),
            Alloc::Shareable => device.alloc_shareable(len).unwrap(),
        };
        DeviceBuffers {
            device,
            window: allocation.wrapping_add(allocation.align_offset(ALIGN)),
            allocation,
            source: device.alloc(len).unwrap(),
            stream: device.create_stream().unwrap(),
        }
    }

    /// `len` bytes of the window at `offset`, copied to the host once the
    /// stream has run what was enqueued.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        self.sync();
        let mut out = vec![0u8; len];
        // SAFETY: the window holds `offset + len` bytes; `out` is a
        // distinct host buffer of `len`.
        unsafe {
            self.device
                .copy(out.as_mut_ptr(), self.window.add(offset), len)
        }
        .unwrap();
        out
    }

    pub fn sync(&self) {
        self.stream
            .synchronize(Instant::now() + Duration::from_secs(30))
            .unwrap();
    }
}

impl Drop for DeviceBuffers {
    fn drop(&mut self) {
        self.sync();
        // SAFETY: nothing uses the memory any more (the stream ran all).
        unsafe {
            self.device.free(self.allocation).unwrap();
            self.device.free(self.source).unwrap();
        }
    }
}

/// `rounds` rounds of a ring on device windows, every call on the
/// rank's stream: each rank puts into the next rank's window (at an
/// offset that moves with the round), waits for the previous rank's data,
/// which the host checks, copied back, and acknowledges it.
pub fn device_ring(comm: &Communicator, rounds: usize, bytes: usize, alloc: Alloc) {
    let (rank, n) = (comm.rank(), comm.count());
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let mem = DeviceBuffers::new(2 * bytes, alloc);
    // SAFETY: the memory outlives the window (deregistered before drop).
    let window = unsafe { comm.register_window(mem.window, 2 * bytes, 0) }.unwrap();
    assert!(comm.window_on_device(window).unwrap());
    if alloc == Alloc::Shareable {
        // Each peer process's allocation is mapped here, as device memory.
        let mapped: Vec<_> = comm
            .memory()
            .breakdown()
            .into_iter()
            .filter(|u| u.purpose == rccl::Purpose::Window && u.place == rccl::Place::Device)
            .filter_map(|u| u.peer)
            .collect();
        let peers: Vec<_> = (0..n).filter(|&p| p != rank).collect();
        assert_eq!(mapped, peers);
    }
    let raw = mem.stream.raw();
    let wait = |peer, sig| WaitDesc {
        peer,
        sig,
        ctx: 0,
        count: 1,
    };
    for round in 0..rounds {
        let offset = (round % 2) * bytes;
        let data = payload(rank, round, bytes);
        // SAFETY: `source` holds 2 * bytes; the stream ran the last put.
        unsafe { mem.device.copy(mem.source, data.as_ptr(), bytes) }.unwrap();
        // SAFETY: the source stays until the stream ran the put (synced
        // below before it is written again).
        unsafe { comm.put_signal_on_stream(mem.source, bytes, next, window, offset, DATA, 0, raw) }
            .unwrap();
        comm.wait_signal_on_stream(&[wait(prev, DATA)], raw)
            .unwrap();
        assert!(
            mem.read(offset, bytes) == payload(prev, round, bytes),
            "rank {rank} round {round}: wrong data from rank {prev}"
        );
        comm.signal_on_stream(prev, ACK, 0, raw).unwrap();
        comm.wait_signal_on_stream(&[wait(next, ACK)], raw).unwrap();
    }
    mem.sync();
    assert!(comm.async_error().is_none());
    comm.deregister_window(window).unwrap();
}
