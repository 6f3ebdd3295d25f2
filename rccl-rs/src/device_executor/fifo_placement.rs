//! Where the transport table's entries put device work's FIFOs
//! ([`FifoPlacement`]): device memory for ranks of this process, shareable
//! device memory for other processes of this host (`P2P/IPC`), and, across
//! hosts, memory that both the device's work and the network proxy reach,
//! as NCCL's network transport sits under its kernels.
//!
//! A network connection's FIFO has its control block (its counters) is page-locked host memory,
//! which the device reaches at the same address (unified addressing) and
//! the proxy reads and writes. Its slots follow in the same block (the
//! device writes and reads them across the bus, the NIC reads and writes
//! host memory) or, with GPUDirect RDMA, are device memory the NIC reads
//! and writes itself: where the network registers device memory
//! (`PtrSupport`: as a dma-buf the device exports, preferred as NCCL
//! prefers it, else through `nvidia-peermem`), `NCCL_NET_GDR_LEVEL` is not
//! `LOC`, and the GPU needs no flush after a NIC's writes (compute
//! capability 9.0 and newer; older GPUs keep the slots in host memory
//! until a flush is built).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use rccl_algorithms::protocol::FIFO_ALIGN;
use rccl_device::Device;
use rccl_transports::network::PtrSupport;
use rccl_transports::FifoPlacement;
use rccl_transports::{control_bytes, FifoMemory};
use rccl_transports::{Connection, Protocol};

use super::links::DeviceMem;
use crate::comm::CommInner;

/// Where device work's links put their FIFOs.
pub(crate) struct DeviceFifoPlacement {
    device: &'static dyn Device,
    /// Slots may be device memory: `NCCL_NET_GDR_LEVEL` allows it, and the
    /// device sees a NIC's writes in order without a flush
    /// (`Device::rdma_receives_ordered`).
    gpu_direct: bool,
    /// Device slots may be exported as a dma-buf (`NCCL_DMABUF_ENABLE`).
    dmabuf: bool,
}

impl DeviceFifoPlacement {
    /// Where `comm`'s device work on `device` puts its FIFOs.
    pub(crate) fn for_comm(comm: &CommInner, device: &'static dyn Device) -> DeviceFifoPlacement {
        DeviceFifoPlacement {
            device,
            gpu_direct: comm.config.net_gdr && device.rdma_receives_ordered(),
            dmabuf: comm.config.dmabuf,
        }
    }
}

/// A device error as the transports take it.
fn device_error(e: rccl_device::Error) -> io::Error {
    io::Error::other(e.to_string())
}

impl FifoPlacement for DeviceFifoPlacement {
    fn network_fifo(&self, bytes: usize, network: PtrSupport) -> io::Result<Arc<dyn FifoMemory>> {
        let slot_bytes = bytes - control_bytes();
        let slots = if !self.gpu_direct {
            None
        } else if network.dmabuf && self.dmabuf {
            match self.dmabuf_slots(slot_bytes) {
                Ok(slots) => Some(slots),
                Err(e) => {
                    tracing::info!(
                        target: crate::debug::NET,
                        "GPUDirect RDMA through a dma-buf unavailable ({e}){}",
                        if network.cuda { ": registering device memory instead" } else { "" }
                    );
                    network
                        .cuda
                        .then(|| self.device_slots(slot_bytes))
                        .transpose()?
                }
            }
        } else if network.cuda {
            Some(self.device_slots(slot_bytes)?)
        } else {
            None
        };
        let control = HostMem::zeroed(
            self.device,
            if slots.is_some() {
                control_bytes()
            } else {
                bytes
            },
        )?;
        Ok(Arc::new(DeviceFifo {
            control,
            slots,
            len: bytes,
        }))
    }

    fn device_fifo(&self, bytes: usize) -> io::Result<Arc<dyn FifoMemory>> {
        let fifo =
            DeviceMem::zeroed(self.device, bytes).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(fifo)
    }

    fn shares_memory(&self) -> bool {
        self.device.shares_memory()
    }

    fn shareable_fifo(&self, bytes: usize) -> io::Result<(Arc<dyn FifoMemory>, OwnedFd)> {
        let ptr = self.device.alloc_shareable(bytes).map_err(device_error)?;
        let fifo = DeviceMem::own(self.device, ptr, bytes);
        let (handle, _) = self.device.export(fifo.ptr).map_err(device_error)?;
        Ok((fifo, handle))
    }

    fn import_fifo(&self, handle: OwnedFd, bytes: usize) -> io::Result<Arc<dyn FifoMemory>> {
        let ptr = self.device.import(handle, bytes).map_err(device_error)?;
        Ok(DeviceMem::own(self.device, ptr, bytes))
    }
}

impl DeviceFifoPlacement {
    /// Slots in device memory the network registers as such.
    fn device_slots(&self, bytes: usize) -> io::Result<DeviceSlots> {
        let mem =
            DeviceMem::zeroed(self.device, bytes).map_err(|e| io::Error::other(e.to_string()))?;
        Ok(DeviceSlots { mem, dmabuf: None })
    }

    /// Slots in device memory exported as a dma-buf, which the network
    /// registers through the file.
    fn dmabuf_slots(&self, bytes: usize) -> io::Result<DeviceSlots> {
        let mem = DeviceMem::own(
            self.device,
            self.device.alloc_shareable(bytes).map_err(device_error)?,
            bytes,
        );
        let (fd, offset) = self.device.export_dmabuf(mem.ptr).map_err(device_error)?;
        Ok(DeviceSlots {
            mem,
            dmabuf: Some((fd, offset)),
        })
    }
}

/// A FIFO's slots in device memory, and their dma-buf if exported.
struct DeviceSlots {
    mem: Arc<DeviceMem>,
    dmabuf: Option<(OwnedFd, u64)>,
}

/// Where the slots of a connection of device work lie, for logs.
pub(crate) fn slots_in(conn: &dyn Connection) -> &'static str {
    let mem = conn.recv_fifo(Protocol::Simple).memory();
    match (mem.slots_on_device(), mem.slots_dmabuf()) {
        (false, _) => "host memory",
        (true, None) => "device memory",
        (true, Some(_)) => "device memory, a dma-buf",
    }
}

/// Page-locked host memory that the device reaches, freed on drop. Its
/// usable part starts at `ptr`, aligned for a FIFO: the driver promises
/// page-locked memory, not its alignment, so the allocation is padded and
/// `raw` is what it returned.
struct HostMem {
    device: &'static dyn Device,
    raw: *mut u8,
    ptr: *mut u8,
}

// SAFETY: the pointer names page-locked host memory that only the FIFO
// protocol's atomics order between threads; it is freed once, on drop.
unsafe impl Send for HostMem {}
// SAFETY: as above; `&HostMem` hands out only the address.
unsafe impl Sync for HostMem {}

impl HostMem {
    fn zeroed(device: &'static dyn Device, bytes: usize) -> io::Result<HostMem> {
        let raw = device
            .alloc_host(bytes + FIFO_ALIGN - 1)
            .map_err(|e| io::Error::other(e.to_string()))?;
        let ptr = raw.wrapping_add(raw.align_offset(FIFO_ALIGN));
        // SAFETY: `alloc_host` returned `bytes + FIFO_ALIGN - 1` bytes of
        // host memory nobody else holds yet; `ptr` is at most
        // `FIFO_ALIGN - 1` past its start.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(HostMem { device, raw, ptr })
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: the memory came from this device's `alloc_host`; the
        // connection and every launch that used it are done with it (each
        // launch holds the FIFO until it ends). Nothing is left to do about
        // a failure here.
        let _ = unsafe { self.device.free_host(self.raw) };
    }
}

/// One FIFO of a connection of device work: its control block in host
/// memory, its slots after it or in device memory.
struct DeviceFifo {
    control: HostMem,
    slots: Option<DeviceSlots>,
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
            Some(slots) => slots.mem.ptr,
            None => self.control.ptr.wrapping_add(control_bytes()),
        }
    }

    fn slots_on_device(&self) -> bool {
        self.slots.is_some()
    }

    fn slots_dmabuf(&self) -> Option<(RawFd, u64)> {
        let (fd, offset) = self.slots.as_ref()?.dmabuf.as_ref()?;
        Some((fd.as_raw_fd(), *offset))
    }
}
