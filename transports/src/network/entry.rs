//! The network's entry in the transport table.

use std::io;
use std::sync::Arc;
use std::time::Instant;

use super::{ListenHandle, Net, NetConnection};
use crate::fifo::{fifo_bytes, Protocol};
use crate::transport::{Context, DeviceLink, Pending, Setup, Transport};
use crate::Connection;

/// The network: a [`Net`] provider, each side listening and connecting to
/// the other's listener (its handle goes through the bootstrap), the
/// connection's slots moved by the process's network proxy. It connects
/// any pair of ranks for host work, so it comes last in the table; it
/// carries device work between hosts (within a host, the device's memory
/// links the ranks), its FIFOs where the device's work reaches them.
pub struct Network<N: Net> {
    net: Arc<N>,
    name: &'static str,
}

impl<N: Net> Network<N> {
    /// The entry for `net` (`NET/<its name>` in logs).
    pub fn new(net: Arc<N>) -> Network<N> {
        let name = super::transport_name(net.name());
        Network { net, name }
    }
}

impl<N: Net> Transport for Network<N> {
    fn name(&self) -> &'static str {
        self.name
    }

    fn can_connect(&self, _cx: &Context<'_>, _peer: usize) -> bool {
        true
    }

    fn setup(&self, _cx: &Context<'_>, _peer: usize, channel: usize) -> io::Result<Setup> {
        // Channel `c` uses device `c mod devices` at both ends (its rail:
        // the communicator gives every rank's provider the same number of
        // devices), listening and connecting on it.
        let dev = channel % self.net.devices().max(1);
        let (handle, listen) = self.net.listen(dev).map_err(io::Error::other)?;
        Ok(Setup {
            info: Some(handle.as_bytes().to_vec()),
            pending: Box::new(NetworkPending::<N> {
                net: self.net.clone(),
                dev,
                listen: Some(listen),
                stage: Default::default(),
                send: None,
                recv: None,
            }),
        })
    }

    fn carries_device_work(&self, cx: &Context<'_>, peer: usize) -> bool {
        cx.device_fifos.is_some() && !cx.same_host(peer)
    }

    /// A connection as for host work, over FIFOs that
    /// [`Context::device_fifos`] places (Simple, whatever `protocol`: a
    /// network connection's FIFOs carry Simple pieces).
    fn setup_device(
        &self,
        cx: &Context<'_>,
        peer: usize,
        channel: usize,
        _protocol: Protocol,
    ) -> io::Result<Setup<DeviceLink>> {
        let Setup { info, pending } = self.setup(cx, peer, channel)?;
        Ok(Setup {
            info,
            pending: Box::new(ForDevice(pending)),
        })
    }
}

/// A network connection being set up for device work.
struct ForDevice(Box<dyn Pending>);

impl Pending<DeviceLink> for ForDevice {
    fn awaits_peer_info(&self) -> bool {
        self.0.awaits_peer_info()
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        peer: usize,
        peer_info: &[u8],
        until: Instant,
    ) -> io::Result<Option<DeviceLink>> {
        let conn = self.0.connect(cx, peer, peer_info, until)?;
        Ok(conn.map(DeviceLink::Proxied))
    }
}

struct NetworkPending<N: Net> {
    net: Arc<N>,
    /// The device (rail) of the connection's channel.
    dev: usize,
    listen: Option<N::ListenComm>,
    stage: N::ConnectStage,
    send: Option<N::SendComm>,
    recv: Option<N::RecvComm>,
}

impl<N: Net> Pending for NetworkPending<N> {
    fn awaits_peer_info(&self) -> bool {
        true
    }

    fn connect(
        &mut self,
        cx: &Context<'_>,
        _peer: usize,
        peer_info: &[u8],
        until: Instant,
    ) -> io::Result<Option<Box<dyn Connection>>> {
        let theirs = ListenHandle::from_bytes(peer_info).map_err(io::Error::other)?;
        let net = &*self.net;
        loop {
            if self.send.is_none() {
                self.send = net
                    .connect(self.dev, &theirs, &mut self.stage)
                    .map_err(io::Error::other)?;
            }
            if let (None, Some(listen)) = (&self.recv, &mut self.listen) {
                self.recv = net.accept(listen).map_err(io::Error::other)?;
            }
            if self.send.is_some() && self.recv.is_some() {
                break;
            }
            if cx.abort.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "aborted"));
            }
            if Instant::now() >= until {
                return Ok(None);
            }
            std::thread::yield_now();
        }
        if let Some(listen) = self.listen.take() {
            net.close_listen(listen).map_err(io::Error::other)?;
        }
        let (send, recv) = (self.send.take(), self.recv.take());
        let (Some(send), Some(recv)) = (send, recv) else {
            unreachable!("both ends are connected")
        };
        let (nslots, slot_bytes) = (cx.fifo.nslots, cx.fifo.slot_bytes(Protocol::Simple));
        let conn = match cx.device_fifos {
            None => NetConnection::start(self.net.clone(), send, recv, nslots, slot_bytes),
            Some(placement) => {
                let props = net.properties(self.dev).map_err(io::Error::other)?;
                let bytes = fifo_bytes(Protocol::Simple, nslots, slot_bytes);
                let memory = [
                    placement.network_fifo(bytes, props.ptr_support)?,
                    placement.network_fifo(bytes, props.ptr_support)?,
                ];
                NetConnection::start_for_device(
                    self.net.clone(),
                    send,
                    recv,
                    nslots,
                    slot_bytes,
                    memory,
                )
            }
        }
        .map_err(io::Error::other)?;
        Ok(Some(Box::new(conn)))
    }
}
