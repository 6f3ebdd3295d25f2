//! Device work across hosts: network connections whose FIFOs the device's
//! work fills and drains and the network proxy moves, as NCCL's network
//! transport sits under its kernels.
//!
//! Each FIFO's control block (its counters) is page-locked host memory,
//! which the device reaches at the same address (unified addressing) and
//! the proxy reads and writes. Its slots follow in the same block (the
//! device writes and reads them across the bus, the NIC reads and writes
//! host memory) or, with GPUDirect RDMA, are device memory the NIC reads
//! and writes itself: where the network registers device memory (its
//! properties say CUDA), `NCCL_NET_GDR_LEVEL` is not `LOC`, and the GPU
//! needs no flush after a NIC's writes (compute capability 9.0 and newer;
//! older GPUs keep the slots in host memory until a flush is built).

use std::io;
use std::sync::Arc;

use rccl_device::Device;
use rccl_transports::fifo::{control_bytes, FifoMemory};
use rccl_transports::transport::FifoPlacement;

use crate::device_links::DeviceMem;

/// Where device work's network connections put their FIFOs.
pub(crate) struct Placement {
    pub device: &'static dyn Device,
    /// Slots may be device memory: `NCCL_NET_GDR_LEVEL` allows it, and the
    /// device sees a NIC's writes in order without a flush
    /// (`Device::rdma_receives_ordered`).
    pub gpu_direct: bool,
}

impl FifoPlacement for Placement {
    fn fifo(&self, bytes: usize, device_slots: bool) -> io::Result<Arc<dyn FifoMemory>> {
        let control_len = if device_slots { control_bytes() } else { bytes };
        let control = HostMem::zeroed(self.device, control_len)?;
        let slots = if device_slots {
            let slots = DeviceMem::zeroed(self.device, bytes - control_bytes())
                .map_err(|e| io::Error::other(e.to_string()))?;
            Some(slots)
        } else {
            None
        };
        Ok(Arc::new(DeviceFifo {
            control,
            slots,
            len: bytes,
        }))
    }

    fn gpu_direct(&self) -> bool {
        self.gpu_direct
    }
}

/// Page-locked host memory that the device reaches, freed on drop.
struct HostMem {
    device: &'static dyn Device,
    ptr: *mut u8,
}

// SAFETY: the pointer names page-locked host memory that only the FIFO
// protocol's atomics order between threads; it is freed once, on drop.
unsafe impl Send for HostMem {}
// SAFETY: as above; `&HostMem` hands out only the address.
unsafe impl Sync for HostMem {}

impl HostMem {
    fn zeroed(device: &'static dyn Device, bytes: usize) -> io::Result<HostMem> {
        let ptr = device
            .alloc_host(bytes)
            .map_err(|e| io::Error::other(e.to_string()))?;
        // SAFETY: `alloc_host` returned `bytes` of host memory nobody else
        // holds yet.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(HostMem { device, ptr })
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: the memory came from this device's `alloc_host`; the
        // connection and every launch that used it are done with it (each
        // launch holds the FIFO until it ends). Nothing is left to do about
        // a failure here.
        let _ = unsafe { self.device.free_host(self.ptr) };
    }
}

/// One FIFO of a connection of device work: its control block in host
/// memory, its slots after it or in device memory.
struct DeviceFifo {
    control: HostMem,
    slots: Option<Arc<DeviceMem>>,
    len: usize,
}

impl FifoMemory for DeviceFifo {
    fn base(&self) -> *mut u8 {
        self.control.ptr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn slots(&self) -> *mut u8 {
        match &self.slots {
            Some(slots) => slots.ptr,
            None => self.control.ptr.wrapping_add(control_bytes()),
        }
    }

    fn slots_on_device(&self) -> bool {
        self.slots.is_some()
    }
}
