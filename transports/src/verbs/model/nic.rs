//! The NIC: its stream listener, its state, and the thread that plays
//! the hardware.

use super::*;

pub(super) struct NicState {
    pub(super) qps: HashMap<u32, Qp>,
    pub(super) regions: HashMap<u32, Region>,
    pub(super) wires: Vec<Option<Wire>>,
    pub(super) next_qpn: u32,
    pub(super) next_key: u32,
    pub(super) frames_sent: u64,
    pub(super) faults: Vec<(Fault, u64)>,
    pub(super) corrupt_next: bool,
    pub(super) stall_until: Option<Instant>,
    pub(super) port_error: Option<String>,
    /// The receive completion of the frame being answered, delivered once
    /// its acknowledgement is on the wire: as on hardware, a responder
    /// that sees the data (and whose process then ends) cannot leave the
    /// sender without its acknowledgement.
    pub(super) arrived: Option<(Arc<Mutex<CqState>>, Wc)>,
}

/// The NIC: its stream listener, its state, and the thread that plays the
/// hardware.
pub(super) struct Nic {
    pub(super) addr: SocketAddrV4,
    pub(super) listener: TcpListener,
    pub(super) bell: OwnedFd,
    pub(super) state: Mutex<NicState>,
}

impl Nic {
    pub(super) fn start(ip: Ipv4Addr) -> io::Result<Arc<Nic>> {
        let listener = TcpListener::bind(SocketAddrV4::new(ip, 0))?;
        listener.set_nonblocking(true)?;
        let SocketAddr::V4(addr) = listener.local_addr()? else {
            unreachable!("bound to an IPv4 address")
        };
        // SAFETY: plain eventfd(2) call; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut faults = Vec::new();
        if let Some(text) = rccl_env::var(FAULT_ENV) {
            let fault = Fault::parse(&text)
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
            faults.push(fault);
        }
        let nic = Arc::new(Nic {
            addr,
            listener,
            // SAFETY: `fd` is a fresh descriptor nobody else owns.
            bell: unsafe { OwnedFd::from_raw_fd(fd) },
            state: Mutex::new(NicState {
                qps: HashMap::new(),
                regions: HashMap::new(),
                wires: Vec::new(),
                next_qpn: 0x100 | (addr.port() as u32) << 12,
                next_key: 0x1000 + addr.port() as u32,
                frames_sent: 0,
                faults,
                corrupt_next: false,
                stall_until: None,
                port_error: None,
                arrived: None,
            }),
        });
        let thread_nic = nic.clone();
        std::thread::Builder::new()
            .name("rccl-ib-model".into())
            .spawn(move || thread_nic.run())?;
        Ok(nic)
    }

    pub(super) fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            name: DEVICE_NAME.into(),
            guid: u64::from(u32::from(*self.addr.ip())) << 16 | u64::from(self.addr.port()),
            pci_path: None,
            ports: vec![PortInfo {
                port: 1,
                active: true,
                link_layer: LinkLayer::Ethernet,
                lid: 0,
                mtu: 5,
                speed_mbps: SPEED_MBPS,
                gids: gid_table(self.addr),
            }],
        }
    }

    pub(super) fn ring(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own; a
        // full counter already means "woken".
        unsafe { libc::write(self.bell.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub(super) fn run(self: Arc<Nic>) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut map: Vec<usize> = Vec::new();
        loop {
            let wake = {
                let mut state = self.state.lock();
                self.step(&mut state);
                fds.clear();
                map.clear();
                for fd in [self.bell.as_raw_fd(), self.listener.as_raw_fd()] {
                    fds.push(libc::pollfd {
                        fd,
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
                let stalled = state.stall_until.is_some();
                for (i, wire) in state.wires.iter().enumerate() {
                    let Some(wire) = wire else { continue };
                    let mut events = if stalled { 0 } else { libc::POLLIN };
                    if wire.pending_out() > 0 {
                        events |= libc::POLLOUT;
                    }
                    fds.push(libc::pollfd {
                        fd: wire.stream.as_raw_fd(),
                        events,
                        revents: 0,
                    });
                    map.push(i);
                }
                state.next_deadline()
            };
            let timeout = wake
                .map(|at| at.saturating_duration_since(Instant::now()))
                .unwrap_or(IDLE)
                .min(IDLE);
            // SAFETY: `fds` holds `fds.len()` initialised pollfds and
            // lives across the call; errors (EINTR) end the sleep.
            unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    timeout.as_millis().max(1) as libc::c_int,
                )
            };
            if fds[0].revents != 0 {
                let mut count = 0u64;
                // SAFETY: reads at most 8 bytes into a live u64 from a
                // non-blocking eventfd we own.
                unsafe { libc::read(self.bell.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
            }
        }
    }

    /// One pass: accept streams, read and handle frames, run timers, send.
    pub(super) fn step(&self, state: &mut NicState) {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if stream.set_nonblocking(true).is_ok() {
                        let _ = stream.set_nodelay(true);
                        state.add_wire(Wire {
                            stream,
                            qpn: None,
                            outgoing: false,
                            peer: peer.to_string(),
                            out: Vec::new(),
                            out_at: 0,
                            inbuf: Vec::new(),
                            closed: false,
                        });
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let now = Instant::now();
        if state.stall_until.is_some_and(|until| now < until) {
            return;
        }
        state.stall_until = None;
        for i in 0..state.wires.len() {
            let Some(wire) = state.wires[i].as_mut() else {
                continue;
            };
            if !wire.fill() {
                wire.closed = true;
            }
            let mut inbuf = std::mem::take(&mut wire.inbuf);
            let mut at = 0;
            while inbuf.len() - at >= FRAME_HEADER {
                let frame = Frame::decode(&inbuf[at..]);
                let payload_len = match frame.kind {
                    WRITE | SEND if frame.len <= MAX_FRAME_PAYLOAD => frame.len as usize,
                    WRITE | SEND => {
                        state.wire_mut(i).closed = true;
                        break;
                    }
                    _ => 0,
                };
                if inbuf.len() - at < FRAME_HEADER + payload_len {
                    break;
                }
                let payload = &inbuf[at + FRAME_HEADER..at + FRAME_HEADER + payload_len];
                if state.port_error.is_none() {
                    state.handle(i, &frame, payload);
                }
                at += FRAME_HEADER + payload_len;
                if state.stall_until.is_some() {
                    break;
                }
            }
            inbuf.drain(..at);
            if let Some(wire) = state.wires[i].as_mut() {
                wire.inbuf = inbuf;
            }
        }
        state.run_timers(now);
        state.transmit(now);
        for i in 0..state.wires.len() {
            let Some(wire) = state.wires[i].as_mut() else {
                continue;
            };
            if !wire.flush() {
                wire.closed = true;
            }
            if wire.closed {
                let wire = state.wires[i].take().expect("just seen");
                state.link_lost(&wire);
            }
        }
    }
}
