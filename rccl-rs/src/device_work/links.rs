//! A communicator's device links: the FIFOs (per channel, peer and
//! protocol), staging buffers and abort word its device work uses, kept
//! between launches as the host path keeps its connections. The two ends
//! of a FIFO find the same memory in a process-wide table keyed by the
//! communicator's secret.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rccl_algorithms::Schedule;
use rccl_device::{Device, Event};
use rccl_transports::fifo::{fifo_bytes, FifoMemory};
use rccl_transports::{Connection, FifoShape, Protocol};

use crate::error::{Error, Result};

/// The rank whose links these are: its communicator (secret and size) and
/// its place in it.
#[derive(Clone, Copy)]
pub(crate) struct Owner {
    pub(crate) secret: [u8; 32],
    pub(crate) nranks: usize,
    pub(crate) rank: usize,
}

/// Device memory, freed when the last holder lets go.
pub(crate) struct DeviceMem {
    device: &'static dyn Device,
    pub(crate) ptr: *mut u8,
    /// An abort word ([`Device::alloc_abort_word`]), not an allocation.
    abort_word: bool,
}

// SAFETY: the pointer names device memory, which any thread may hand to
// the device; it is freed once, by the last holder's drop.
unsafe impl Send for DeviceMem {}
// SAFETY: as above; nothing is read or written through `&DeviceMem`.
unsafe impl Sync for DeviceMem {}

impl DeviceMem {
    /// Takes over `ptr`, device memory of `device` (allocated, shareable
    /// or imported), freed on the last drop.
    pub(crate) fn own(device: &'static dyn Device, ptr: *mut u8) -> Arc<DeviceMem> {
        Arc::new(DeviceMem {
            device,
            ptr,
            abort_word: false,
        })
    }

    /// A word device work polls to stop, set from the host.
    pub(crate) fn abort_word(device: &'static dyn Device) -> Result<Arc<DeviceMem>> {
        let ptr = device.alloc_abort_word().map_err(Error::from)?;
        Ok(Arc::new(DeviceMem {
            device,
            ptr: ptr.cast(),
            abort_word: true,
        }))
    }

    pub(crate) fn zeroed(device: &'static dyn Device, bytes: usize) -> Result<Arc<DeviceMem>> {
        let ptr = device.alloc_zeroed(bytes).map_err(Error::from)?;
        Ok(DeviceMem::own(device, ptr))
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

/// Which FIFO: the communicator (its secret and size), the channel, the
/// sending and receiving ranks, the protocol and the slot size.
type FifoKey = ([u8; 32], usize, usize, usize, usize, usize, usize);

/// Every FIFO of a communicator of this process, by key: the first of its
/// two ranks to need it allocates it, the other finds it here.
static FIFOS: Mutex<Option<HashMap<FifoKey, Shared>>> = Mutex::new(None);

/// A FIFO of the table. The table holds it until its second rank takes
/// it: the first may run its part and destroy its communicator before the
/// second comes, and what it sent waits in the FIFO. (A FIFO whose second
/// rank never comes, its communicator failed, stays until the process
/// exits.)
enum Shared {
    Waiting(Arc<DeviceMem>),
    Taken(Weak<DeviceMem>),
}

/// The FIFO to a peer and the one from it.
pub(crate) type FifoPair = (Arc<DeviceMem>, Arc<DeviceMem>);

/// A communicator's device work state, kept between launches.
pub(crate) struct DeviceLinks {
    /// `(channel, peer, protocol index)` -> (FIFO to the peer, FIFO from it).
    pub(crate) fifos: HashMap<(usize, usize, usize), FifoPair>,
    /// `(channel, peer)` -> the network connection to a peer on another
    /// host (Simple: `device_work::protocol`), whose FIFOs the network
    /// proxy moves (`device_net.rs`).
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
}

impl DeviceLinks {
    pub(crate) fn new(max_channels: usize, device: &'static dyn Device) -> Result<DeviceLinks> {
        Ok(DeviceLinks {
            fifos: HashMap::new(),
            net: HashMap::new(),
            scratch: (0..max_channels).map(|_| None).collect(),
            staging: Vec::new(),
            abort: DeviceMem::abort_word(device)?,
            last: None,
        })
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
        let proto = protocol.index();
        let mut missing = Vec::new();
        for (channel, steps) in schedule.channels.iter().enumerate() {
            if steps.is_empty() {
                continue;
            }
            if self.scratch[channel].is_none() {
                let largest = shape.slot_bytes.iter().copied().max().unwrap_or(0);
                self.scratch[channel] = Some(DeviceMem::zeroed(device, largest)?);
            }
            let peers = steps
                .iter()
                .flat_map(|s| s.prims.iter())
                .flat_map(|p| [p.recv_peer(), p.send_peer()])
                .flatten();
            for peer in peers {
                if !self.fifos.contains_key(&(channel, peer, proto))
                    && !self.net.contains_key(&(channel, peer))
                    && !missing.contains(&(channel, peer))
                {
                    missing.push((channel, peer));
                }
            }
        }
        Ok(missing)
    }

    /// Makes the links `wanted` (from [`DeviceLinks::missing`]) to ranks of
    /// this process: the first of a FIFO's two ranks allocates it, the
    /// other finds it in the process-wide table.
    pub(crate) fn connect_local(
        &mut self,
        device: &'static dyn Device,
        owner: Owner,
        shape: &FifoShape,
        protocol: Protocol,
        wanted: &[(usize, usize)],
    ) -> Result<()> {
        let proto = protocol.index();
        let slot_bytes = shape.slot_bytes(protocol);
        let bytes = fifo_bytes(protocol, shape.nslots, slot_bytes);
        let Owner {
            secret,
            nranks,
            rank,
        } = owner;
        let mut table = FIFOS.lock();
        let table = table.get_or_insert_with(HashMap::new);
        table.retain(|_, fifo| match fifo {
            Shared::Waiting(_) => true,
            Shared::Taken(fifo) => fifo.strong_count() > 0,
        });
        for &(channel, peer) in wanted {
            let mut fifo = |from: usize, to: usize| -> Result<Arc<DeviceMem>> {
                let key = (secret, nranks, channel, from, to, proto, slot_bytes);
                let found = match table.get(&key) {
                    Some(Shared::Waiting(fifo)) => Some(fifo.clone()),
                    Some(Shared::Taken(fifo)) => fifo.upgrade(),
                    None => None,
                };
                if let Some(fifo) = found {
                    table.insert(key, Shared::Taken(Arc::downgrade(&fifo)));
                    return Ok(fifo);
                }
                let fifo = DeviceMem::zeroed(device, bytes)?;
                table.insert(key, Shared::Waiting(fifo.clone()));
                Ok(fifo)
            };
            let pair = (fifo(rank, peer)?, fifo(peer, rank)?);
            self.fifos.insert((channel, peer, proto), pair);
        }
        Ok(())
    }

    /// Adds the link to `peer` on `channel` for `protocol`: the FIFO to
    /// the peer and the one from it.
    pub(crate) fn insert(
        &mut self,
        channel: usize,
        peer: usize,
        protocol: Protocol,
        pair: FifoPair,
    ) {
        self.fifos.insert((channel, peer, protocol.index()), pair);
    }

    /// The FIFOs of the network connections, which the communicator's work
    /// may use too.
    pub(crate) fn net_memory(&self) -> impl Iterator<Item = Arc<dyn FifoMemory>> + '_ {
        self.net.values().flat_map(|conn| {
            [
                conn.send_fifo(Protocol::Simple).memory().clone(),
                conn.recv_fifo(Protocol::Simple).memory().clone(),
            ]
        })
    }

    /// Every piece of device memory the communicator's work may use.
    pub(crate) fn memory(&self) -> impl Iterator<Item = Arc<DeviceMem>> + '_ {
        self.fifos
            .values()
            .flat_map(|(send, recv)| [send.clone(), recv.clone()])
            .chain(self.scratch.iter().flatten().cloned())
            .chain(self.staging.iter().cloned())
            .chain([self.abort.clone()])
    }
}
