//! The links of device work, made through the one connect loop
//! ([`crate::connect::finish`]): each through the first entry of the
//! transport table that carries device work between the pair, its FIFOs
//! where the device reaches them.

use std::time::Instant;

use rccl_transports::table;
use rccl_transports::{Context, DeviceLink, FifoPlacement, Protocol};

use crate::comm::{CommInner, PeerWatch};
use crate::connect::{
    context, endpoints, finish, set_up, PendingLink, Setups, DEVICE_CONNECT_TAG_BASE, SETUP_POLL,
};
use crate::error::{Error, Result};

/// A link of device work to `peer` on `channel`, made by `transport`.
pub(crate) struct DeviceConnection {
    pub channel: usize,
    pub peer: usize,
    pub transport: &'static str,
    pub link: DeviceLink,
}

/// Makes the links `wanted` (`(channel, peer)`) of device work for
/// `protocol`, each through the first entry of the transport table that
/// carries device work between the pair, its FIFOs where `placement`
/// says (the device reaches them). Every peer makes the same call (the
/// links of a schedule come in pairs), and all links are set up before
/// any is waited for; fails at once with a peer's setup failure, or at
/// the communicator's timeout.
pub(crate) fn connect_for_device(
    comm: &CommInner,
    wanted: &[(usize, usize)],
    protocol: Protocol,
    placement: &dyn FifoPlacement,
) -> Result<Vec<DeviceConnection>> {
    let endpoints = endpoints(comm);
    let cx = context(comm, &endpoints, Some(placement));
    let deadline = Instant::now() + comm.config.timeout;
    let pending = wanted
        .iter()
        .map(|&(channel, peer)| {
            let chosen = table::choose_for_device(&cx, peer).ok_or_else(|| {
                Error::InvalidUsage(format!(
                    "rank {}: no transport carries device work to {}",
                    comm.rank,
                    comm.describe(peer)
                ))
            });
            set_up(comm, peer, channel, DEVICE_CONNECT_TAG_BASE, chosen, |t| {
                t.setup_device(&cx, peer, channel, protocol)
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut pending = pending.into_iter().map(|link| (0, link)).collect();
    let mut device = DeviceSetups {
        comm,
        cx,
        deadline,
        watch: PeerWatch::default(),
        made: Vec::with_capacity(wanted.len()),
    };
    finish(&mut pending, &mut device)?;
    Ok(device.made)
}

/// The links of one communicator's device work under way, for [`finish`].
struct DeviceSetups<'c> {
    comm: &'c CommInner,
    cx: Context<'c>,
    deadline: Instant,
    /// Whether the peers waited for are gone.
    watch: PeerWatch,
    made: Vec<DeviceConnection>,
}

impl Setups<DeviceLink> for DeviceSetups<'_> {
    fn comm(&self, _: usize) -> &CommInner {
        self.comm
    }

    fn context(&self, _: usize) -> &Context<'_> {
        &self.cx
    }

    /// The link's memory enters the ledger where the links keep it
    /// (`DeviceLinks::insert`).
    fn made(&mut self, _: usize, pending: PendingLink<DeviceLink>, link: DeviceLink) -> Result<()> {
        let link = DeviceConnection {
            channel: pending.channel,
            peer: pending.peer,
            transport: pending.transport,
            link,
        };
        self.made.push(link);
        Ok(())
    }

    fn fail(&mut self, _: usize, error: Error) -> Error {
        error
    }

    fn stalled(&mut self, pending: &[(usize, PendingLink<DeviceLink>)]) -> Result<()> {
        let comm = self.comm;
        let peers: Vec<usize> = pending.iter().map(|(_, link)| link.peer).collect();
        self.watch.check(comm, &peers)?;
        if Instant::now() >= self.deadline {
            let link = &pending[0].1;
            return Err(Error::System(format!(
                "rank {} of {}: timed out after {:?} waiting for {} to set up {} for device \
                 work (does it run the same calls?)",
                comm.rank,
                comm.nranks,
                comm.config.timeout,
                comm.describe(link.peer),
                link.what()
            )));
        }
        Ok(())
    }

    fn poll_until(&self, now: Instant) -> Instant {
        self.deadline.min(now + SETUP_POLL)
    }
}
