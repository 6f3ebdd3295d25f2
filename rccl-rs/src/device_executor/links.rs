//! A communicator's device links: the FIFOs (per channel, peer and
//! protocol), staging buffers and abort word its device work uses, kept
//! between launches as the host executor keeps its connections. The
//! transport table's entries make the links (`launch.rs` asks for them).

use std::collections::HashMap;
use std::sync::Arc;

use rccl_algorithms::Schedule;
use rccl_device::{Device, Event};
use rccl_transports::DeviceLink;
use rccl_transports::FifoMemory;
use rccl_transports::{Connection, FifoShape, Protocol};

use crate::comm::{ExecState, KeptLinks};
use crate::error::{Error, Result};
use crate::memory::{Hold, Ledger, MemUse, Place, Purpose};
use crate::types::Executor;

/// Device memory, freed when the last holder lets go.
pub(crate) struct DeviceMem {
    device: &'static dyn Device,
    pub(crate) ptr: *mut u8,
    len: usize,
    /// An abort word ([`Device::alloc_abort_word`]), not an allocation.
    abort_word: bool,
}

// SAFETY: the pointer names device memory, which any thread may hand to
// the device; it is freed once, by the last holder's drop.
unsafe impl Send for DeviceMem {}
// SAFETY: as above; nothing is read or written through `&DeviceMem`.
unsafe impl Sync for DeviceMem {}

impl DeviceMem {
    /// Takes over `ptr`, `len` bytes of device memory of `device`
    /// (allocated, shareable or imported), freed on the last drop.
    pub(crate) fn own(device: &'static dyn Device, ptr: *mut u8, len: usize) -> Arc<DeviceMem> {
        Arc::new(DeviceMem {
            device,
            ptr,
            len,
            abort_word: false,
        })
    }

    /// A word device work polls to stop, set from the host.
    pub(crate) fn abort_word(device: &'static dyn Device) -> Result<Arc<DeviceMem>> {
        let ptr = device.alloc_abort_word().map_err(Error::from)?;
        Ok(Arc::new(DeviceMem {
            device,
            ptr: ptr.cast(),
            len: std::mem::size_of::<u32>(),
            abort_word: true,
        }))
    }

    pub(crate) fn zeroed(device: &'static dyn Device, bytes: usize) -> Result<Arc<DeviceMem>> {
        let ptr = device.alloc_zeroed(bytes).map_err(Error::from)?;
        Ok(DeviceMem::own(device, ptr, bytes))
    }
}

/// A FIFO the device's work fills or drains.
impl FifoMemory for DeviceMem {
    fn base(&self) -> *mut u8 {
        self.ptr
    }

    fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        // SAFETY: the memory came from this device; every launch that used
        // it held a reference until it finished, so none uses it now.
        // Nothing is left to do about a failure here.
        let _ = unsafe {
            if self.abort_word {
                self.device.free_abort_word(self.ptr.cast())
            } else {
                self.device.free(self.ptr)
            }
        };
    }
}

/// The FIFO to a peer and the one from it.
type FifoPair = (Arc<dyn FifoMemory>, Arc<dyn FifoMemory>);

/// A communicator's device work state, kept between launches.
pub(crate) struct DeviceLinks {
    /// `(channel, peer, protocol index)` -> (FIFO to the peer, FIFO from it).
    pub(crate) fifos: HashMap<(usize, usize, usize), FifoPair>,
    /// `(channel, peer)` -> the network connection to a peer on another
    /// host (Simple: `work::protocol`), whose FIFOs the network
    /// proxy moves (`fifo_placement.rs` places them).
    pub(crate) net: HashMap<(usize, usize), Arc<dyn Connection>>,
    /// Per channel, the staging buffer of one piece of any protocol.
    pub(crate) scratch: Vec<Option<Arc<DeviceMem>>>,
    /// Staging buffers of inputs (board-sized), the `k`-th for the `k`-th
    /// staged operation of a launch.
    pub(crate) staging: Vec<Arc<DeviceMem>>,
    /// The word the communicator's device work polls; set (by the device
    /// when a launch's stop condition holds), it stops.
    pub(crate) abort: Arc<DeviceMem>,
    /// Recorded after the last launch: the next one waits for it.
    pub(crate) last: Option<Arc<dyn Event>>,
    /// The ledger the memory above is entered in, and its entries.
    ledger: Arc<Ledger>,
    held: Vec<Hold>,
}

impl KeptLinks for DeviceLinks {
    fn connections(&self) -> Vec<&dyn Connection> {
        self.net.values().map(|conn| &**conn).collect()
    }
}

impl DeviceLinks {
    /// The device links `state` keeps, made on the first launch of its
    /// communicator's device work.
    pub(crate) fn kept<'s>(
        state: &'s mut ExecState,
        max_channels: usize,
        device: &'static dyn Device,
        ledger: &Arc<Ledger>,
    ) -> Result<&'s mut DeviceLinks> {
        if state.device_links.is_none() {
            let links = DeviceLinks::new(max_channels, device, ledger.clone())?;
            state.device_links = Some(Box::new(links));
        }
        Ok(Self::made(state))
    }

    /// The device links `state` keeps, once [`DeviceLinks::kept`] made them.
    pub(crate) fn made(state: &mut ExecState) -> &mut DeviceLinks {
        let kept: &mut dyn std::any::Any = state
            .device_links
            .as_deref_mut()
            .expect("the device links are made before they are used");
        kept.downcast_mut()
            .expect("only the device executor keeps device links")
    }

    pub(crate) fn new(
        max_channels: usize,
        device: &'static dyn Device,
        ledger: Arc<Ledger>,
    ) -> Result<DeviceLinks> {
        let word = std::mem::size_of::<u32>() as u64;
        let held = vec![ledger.hold(device_use(Purpose::WorkTable, word))?];
        Ok(DeviceLinks {
            fifos: HashMap::new(),
            net: HashMap::new(),
            scratch: (0..max_channels).map(|_| None).collect(),
            staging: Vec::new(),
            abort: DeviceMem::abort_word(device)?,
            last: None,
            ledger,
            held,
        })
    }

    /// `bytes` of device memory for `purpose`, entered in the ledger before
    /// they are allocated.
    pub(crate) fn zeroed(
        &mut self,
        device: &'static dyn Device,
        purpose: Purpose,
        bytes: usize,
    ) -> Result<Arc<DeviceMem>> {
        let held = self.ledger.hold(device_use(purpose, bytes as u64))?;
        let mem = DeviceMem::zeroed(device, bytes)?;
        self.held.push(held);
        Ok(mem)
    }

    /// The `(channel, peer)` links `schedule` needs with `protocol` that
    /// are not made yet, allocating the channels' staging buffers on the
    /// way.
    pub(crate) fn missing(
        &mut self,
        device: &'static dyn Device,
        shape: &FifoShape,
        schedule: &Schedule,
        protocol: Protocol,
    ) -> Result<Vec<(usize, usize)>> {
        for (channel, steps) in schedule.channels.iter().enumerate() {
            if !steps.is_empty() && self.scratch[channel].is_none() {
                let largest = shape.slot_bytes.iter().copied().max().unwrap_or(0);
                self.scratch[channel] = Some(self.zeroed(device, Purpose::Staging, largest)?);
            }
        }
        let mut missing = Vec::new();
        for (channel, peer) in linked(schedule) {
            if !self.has(channel, peer, protocol) && !missing.contains(&(channel, peer)) {
                missing.push((channel, peer));
            }
        }
        Ok(missing)
    }

    /// Whether `schedule` needs a link with `protocol` not made yet.
    pub(crate) fn lacks(&self, schedule: &Schedule, protocol: Protocol) -> bool {
        linked(schedule).any(|(channel, peer)| !self.has(channel, peer, protocol))
    }

    /// Whether the link to `peer` on `channel` for `protocol` is made (a
    /// network connection serves every protocol).
    fn has(&self, channel: usize, peer: usize, protocol: Protocol) -> bool {
        self.fifos.contains_key(&(channel, peer, protocol.index()))
            || self.net.contains_key(&(channel, peer))
    }

    /// Adds the link to `peer` on `channel` for `protocol`, entering its
    /// memory in the ledger: of FIFOs both ranks reach, the one this rank
    /// drains (its receiver allocates it); of a network connection, its
    /// private FIFOs.
    pub(crate) fn insert(
        &mut self,
        channel: usize,
        peer: usize,
        protocol: Protocol,
        link: DeviceLink,
    ) -> Result<()> {
        let what = match &link {
            DeviceLink::Direct { recv, .. } => device_use(Purpose::Fifo, recv.len() as u64),
            DeviceLink::Proxied(conn) => {
                let slots_on_device = conn.recv_fifo(Protocol::Simple).memory().slots_on_device();
                let place = if slots_on_device {
                    Place::Device
                } else {
                    Place::Host
                };
                MemUse::new(Purpose::Fifo, place, conn.held_bytes() as u64)
                    .executor(Executor::Device)
            }
        };
        self.held.push(self.ledger.hold(what.peer(peer))?);
        match link {
            DeviceLink::Direct { send, recv } => {
                self.fifos
                    .insert((channel, peer, protocol.index()), (send, recv));
            }
            DeviceLink::Proxied(conn) => {
                self.net.insert((channel, peer), Arc::from(conn));
            }
        }
        Ok(())
    }

    /// Every FIFO the communicator's work may use.
    pub(crate) fn fifo_memory(&self) -> impl Iterator<Item = Arc<dyn FifoMemory>> + '_ {
        let proxied = self.net.values().flat_map(|conn| {
            [
                conn.send_fifo(Protocol::Simple).memory().clone(),
                conn.recv_fifo(Protocol::Simple).memory().clone(),
            ]
        });
        self.fifos
            .values()
            .flat_map(|(send, recv)| [send.clone(), recv.clone()])
            .chain(proxied)
    }

    /// The communicator's other device memory its work may use.
    pub(crate) fn memory(&self) -> impl Iterator<Item = Arc<DeviceMem>> + '_ {
        self.scratch
            .iter()
            .flatten()
            .cloned()
            .chain(self.staging.iter().cloned())
            .chain([self.abort.clone()])
    }
}

/// `bytes` of device memory for `purpose`, used by device work.
fn device_use(purpose: Purpose, bytes: u64) -> MemUse {
    MemUse::new(purpose, Place::Device, bytes).executor(Executor::Device)
}

/// Every `(channel, peer)` that `schedule` links, repeats included.
fn linked(schedule: &Schedule) -> impl Iterator<Item = (usize, usize)> + '_ {
    schedule
        .channels
        .iter()
        .enumerate()
        .flat_map(|(channel, steps)| {
            steps
                .iter()
                .flat_map(|s| s.prims.iter())
                .flat_map(|p| [p.recv_peer(), p.send_peer()])
                .flatten()
                .map(move |peer| (channel, peer))
        })
}
