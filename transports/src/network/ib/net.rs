//! The IB network behind the [`Net`] interface.

use super::*;

impl Net for Ib {
    type ListenComm = IbListen;
    type ConnectStage = IbConnect;
    type SendComm = IbSend;
    type RecvComm = IbRecv;
    type MemHandle = IbMr;
    type Request = IbRequest;

    fn name(&self) -> &'static str {
        "IB"
    }

    fn devices(&self) -> usize {
        self.ports.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties, NetError> {
        let port = self.port(dev)?;
        Ok(Properties {
            name: format!("{}:{}", port.name, port.info.port),
            pci_path: port.pci_path.clone(),
            guid: port.guid,
            ptr_support: PtrSupport {
                host: true,
                cuda: self.verbs.registers_device_memory(),
                dmabuf: self.open(dev).is_ok_and(|device| device.registers_dmabuf()),
            },
            reg_is_global: false,
            force_flush: false,
            speed_mbps: port.info.speed_mbps.max(1),
            port: u32::from(port.info.port),
            latency_us: 0.0,
            max_comms: 65_536,
            max_recvs: MAX_RECVS,
            max_p2p_bytes: MAX_P2P_BYTES,
        })
    }

    fn listen(&self, dev: usize) -> Result<(ListenHandle, IbListen), NetError> {
        self.port(dev)?;
        let bind = SocketAddr::new(self.ip, 0);
        let listener =
            TcpListener::bind(bind).map_err(|e| NetError::io(NET, "listening on", bind, &e))?;
        let local = listener
            .local_addr()
            .and_then(|local| listener.set_nonblocking(true).map(|()| local))
            .map_err(|e| NetError::io(NET, "listening on", bind, &e))?;
        let mut id = [0u8; LISTENER_ID];
        fill_random(&mut id).map_err(|e| NetError::io(NET, "listening on", local, &e))?;
        let handle = ListenHandle::from_bytes(&handle_bytes(local, &id))?;
        Ok((
            handle,
            IbListen {
                listener,
                local,
                id,
                dev,
                accepting: Vec::new(),
            },
        ))
    }

    fn connect(
        &self,
        dev: usize,
        handle: &ListenHandle,
        stage: &mut IbConnect,
    ) -> Result<Option<IbSend>, NetError> {
        self.port(dev)?;
        if stage.step.is_none() {
            let (addr, id) = parse_handle(handle)?;
            let stream = crate::tcp_connect::start_connect(None, addr)
                .map_err(|e| NetError::io(NET, "connecting to", addr, &e))?;
            stage.step = Some(ConnectStep::Handshake(Client::new(stream, id, None), addr));
        }
        let result = self.connect_step(dev, stage);
        if result.is_err() {
            stage.step = None;
        }
        result
    }

    fn accept(&self, listen: &mut IbListen) -> Result<Option<IbRecv>, NetError> {
        loop {
            match listen.listener.accept() {
                Ok((stream, peer)) => {
                    let deadline = Instant::now() + self.handshake_timeout;
                    match Server::new(stream, peer, deadline, &self.secret, None) {
                        Ok(server) => listen.accepting.push(Accepting {
                            peer,
                            deadline,
                            step: AcceptStep::Handshake(server),
                        }),
                        Err(e) => {
                            tracing::warn!(remote = %peer, "dropped a connection to {}: {e}", listen.local)
                        }
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    break
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(NetError::io(NET, "accepting on", listen.local, &e)),
            }
        }
        let mut i = 0;
        while i < listen.accepting.len() {
            let accepting = &mut listen.accepting[i];
            let outcome = match self.accept_step(listen.dev, &listen.id, accepting) {
                Ok(None) if Instant::now() >= accepting.deadline => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "timed out setting up the connection",
                )
                .to_string()),
                outcome => outcome,
            };
            match outcome {
                Ok(None) => i += 1,
                Ok(Some(recv)) => {
                    listen.accepting.swap_remove(i);
                    return Ok(Some(recv));
                }
                Err(why) => {
                    let accepting = listen.accepting.swap_remove(i);
                    tracing::warn!(
                        remote = %accepting.peer,
                        listener = %listen.local,
                        "rejected an IB connection: {why}"
                    );
                }
            }
        }
        Ok(None)
    }

    unsafe fn reg_mr(
        &self,
        comm: CommRef<'_, Self>,
        data: *mut u8,
        size: usize,
        memory: MemoryType,
    ) -> Result<IbMr, NetError> {
        let (device, peer) = match comm {
            CommRef::Send(send) => (send.state.lock().link.device.clone(), send.peer.clone()),
            CommRef::Recv(recv) => (recv.state.lock().link.device.clone(), recv.peer.clone()),
        };
        let access = ACCESS_LOCAL_WRITE | ACCESS_REMOTE_WRITE | ACCESS_REMOTE_READ;
        let mr = match memory {
            // SAFETY: the caller keeps the bytes valid while registered
            // (this function's contract).
            MemoryType::Host => unsafe { device.reg_mr(data, size, access) },
            // SAFETY: as for host memory; the device registers device
            // memory it can reach.
            MemoryType::Cuda if self.verbs.registers_device_memory() => unsafe {
                device.reg_mr(data, size, access)
            },
            // Peers address the buffer by its device address.
            // SAFETY: as for host memory; `fd` and `offset` describe the
            // same bytes (the caller's contract).
            MemoryType::DmaBuf { fd, offset } if device.registers_dmabuf() => unsafe {
                device.reg_dmabuf_mr(fd, offset, size, data as u64, access)
            },
            _ => return Err(NetError::Unsupported { net: "IB", memory }),
        }
        .map_err(|e| verbs_error("registering memory for", &peer, &e))?;
        Ok(IbMr {
            start: data as usize,
            len: size,
            mr,
        })
    }

    fn dereg_mr(&self, _comm: CommRef<'_, Self>, mhandle: IbMr) -> Result<(), NetError> {
        drop(mhandle);
        Ok(())
    }

    fn isend(
        &self,
        comm: &mut IbSend,
        data: *const u8,
        size: usize,
        tag: i32,
        mhandle: &IbMr,
    ) -> Result<Option<IbRequest>, NetError> {
        mhandle.check(data as usize, size)?;
        if size as u64 > MAX_P2P_BYTES {
            return Err(NetError::InvalidArgument(format!(
                "a send of {size} bytes exceeds {MAX_P2P_BYTES}"
            )));
        }
        let mut state = comm.state.lock();
        state.admit(NET_MAX_REQUESTS * MAX_RECVS)?;
        let id = state.ops.push(SendOpState {
            data: data as u64,
            size,
            tag,
            lkey: mhandle.mr.lkey(),
            left: 0,
            slot: None,
            posted: false,
            state: OpState::Pending,
        });
        state.progress();
        Ok(Some(IbRequest(Request::new(Kind::Send(
            comm.state.clone(),
            id,
        )))))
    }

    fn irecv(
        &self,
        comm: &mut IbRecv,
        buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<IbRequest>, NetError> {
        let mut state = comm.state.lock();
        check_recv(buffers, state.max_recvs)?;
        state.admit(NET_MAX_REQUESTS)?;
        let id = state.groups.next_id();
        let nqps = state.link.qps.len();
        for qp in 0..nqps {
            if let Err(e) = state.link.qps[qp].post_recv(&[RecvWr {
                wr_id: id,
                sge: None,
            }]) {
                state
                    .link
                    .fail_with("receiving from", io::ErrorKind::Other, e.to_string());
                return Err(state.link.broken().expect("just failed"));
            }
        }
        let slot = (id as usize % NET_MAX_REQUESTS) * MAX_RECVS;
        let entries: Vec<[u8; CTS_BYTES]> = buffers
            .iter()
            .map(|b| {
                CtsEntry {
                    addr: b.data as u64,
                    size: b.size as u64,
                    rkey: b.mhandle.mr.rkey(),
                    tag: b.tag,
                    nreqs: buffers.len() as u32,
                    seq: (id + 1) as u32,
                }
                .to_bytes()
            })
            .collect();
        let wrs: Vec<SendWr> = entries
            .iter()
            .enumerate()
            .map(|(r, bytes)| SendWr {
                wr_id: WR_CTS | id,
                sge: Some(Sge {
                    addr: bytes.as_ptr() as u64,
                    len: CTS_BYTES as u32,
                    lkey: 0,
                }),
                op: SendOp::Write {
                    remote_addr: state.fifo_addr + ((slot + r) * CTS_BYTES) as u64,
                    rkey: state.fifo_rkey,
                    imm: None,
                },
                signaled: r + 1 == entries.len(),
                inline: true,
            })
            .collect();
        if !state.link.post_send(0, &wrs, "receiving from") {
            return Err(state.link.broken().expect("just failed"));
        }
        state.groups.push(RecvGroup {
            bufs: buffers.iter().map(|b| (b.size, b.tag)).collect(),
            sizes: Vec::with_capacity(buffers.len()),
            left: nqps,
            state: OpState::Pending,
        });
        Ok(Some(IbRequest(Request::new(Kind::Recv(
            comm.state.clone(),
            id,
        )))))
    }

    fn iflush(
        &self,
        _comm: &mut IbRecv,
        _buffers: &[RecvBuffer<'_, Self>],
    ) -> Result<Option<IbRequest>, NetError> {
        nothing_to_flush(IbRequest(Request::new(Kind::Flush)))
    }

    fn test(&self, request: &mut IbRequest) -> Result<Option<Sizes>, NetError> {
        request.0.test()
    }

    fn close_send(&self, comm: IbSend) -> Result<(), NetError> {
        close(&mut comm.state.lock().link);
        Ok(())
    }

    fn close_recv(&self, comm: IbRecv) -> Result<(), NetError> {
        close(&mut comm.state.lock().link);
        Ok(())
    }

    fn close_listen(&self, comm: IbListen) -> Result<(), NetError> {
        drop(comm);
        Ok(())
    }

    fn readiness(&self, request: &IbRequest) -> Option<Readiness> {
        let fd = match &request.0.kind {
            Kind::Send(state, id) => {
                let mut state = state.lock();
                // A FIFO entry lands by RDMA and raises no event: a send
                // still waiting for one is tested again soon instead.
                if !state.ops.get_mut(*id).posted {
                    return None;
                }
                state.link.cq.event_fd()
            }
            Kind::Recv(state, _) => state.lock().link.cq.event_fd(),
            Kind::Flush => return None,
        };
        Some(Readiness { fd, readable: true })
    }
}
