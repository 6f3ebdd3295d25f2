//! Setting communicators up without blocking: the listener, and the
//! steps of `connect` and `accept` (the handshake, then the exchange of
//! queue-pair details).

use super::*;

/// A listening communicator.
pub struct IbListen {
    pub(super) listener: TcpListener,
    pub(super) local: SocketAddr,
    pub(super) id: [u8; LISTENER_ID],
    pub(super) dev: usize,
    pub(super) accepting: Vec<Accepting>,
}

/// A connection a peer made to a listener, being set up.
pub(super) struct Accepting {
    pub(super) peer: SocketAddr,
    pub(super) deadline: Instant,
    pub(super) step: AcceptStep,
}

pub(super) enum AcceptStep {
    Handshake(Server),
    Details {
        stream: TcpStream,
        theirs: Partial,
    },
    Answer {
        stream: TcpStream,
        link: Box<Link>,
        fifo: (u64, u32),
        ours: Partial,
        ready: Partial,
    },
    Failed,
}

/// A `connect` in progress.
#[derive(Default)]
pub struct IbConnect {
    pub(super) step: Option<ConnectStep>,
}

pub(super) enum ConnectStep {
    Handshake(Client, SocketAddr),
    Details {
        stream: TcpStream,
        peer: SocketAddr,
        link: Box<Link>,
        ours: Partial,
        theirs: Partial,
        ready: Option<Partial>,
        sizes: (u64, u32),
    },
}

impl Ib {
    pub(super) fn connect_step(
        &self,
        dev: usize,
        stage: &mut IbConnect,
    ) -> Result<Option<IbSend>, NetError> {
        loop {
            match stage.step.as_mut().expect("a connect in progress") {
                ConnectStep::Handshake(client, addr) => {
                    let addr = *addr;
                    match client.progress(&self.secret) {
                        Ok(false) => return Ok(None),
                        Ok(true) => {}
                        Err(e) => {
                            return Err(
                                if matches!(
                                    e.kind(),
                                    io::ErrorKind::PermissionDenied | io::ErrorKind::InvalidData
                                ) {
                                    NetError::Refused {
                                        peer: addr.to_string(),
                                        reason: e.to_string(),
                                    }
                                } else {
                                    NetError::io(NET, "connecting to", addr, &e)
                                },
                            )
                        }
                    }
                    let Some(ConnectStep::Handshake(client, _)) = stage.step.take() else {
                        unreachable!("in the handshake")
                    };
                    let mut link =
                        self.resources(dev, self.config.qps_per_connection, Area::fifo())?;
                    link.peer = addr.to_string();
                    let ours = Partial::to_write(Info::of(&link).encode());
                    stage.step = Some(ConnectStep::Details {
                        stream: client.into_stream().into_tcp(),
                        peer: addr,
                        link: Box::new(link),
                        ours,
                        theirs: Partial::to_read(INFO_LEN),
                        ready: None,
                        sizes: (0, 0),
                    });
                }
                ConnectStep::Details {
                    stream,
                    peer,
                    link,
                    ours,
                    theirs,
                    ready,
                    sizes,
                } => {
                    let peer = *peer;
                    let io_err = |e: io::Error| NetError::io(NET, "connecting to", peer, &e);
                    if !ours.write(stream).map_err(io_err)? {
                        return Ok(None);
                    }
                    if ready.is_none() {
                        if !theirs.read(stream).map_err(io_err)? {
                            return Ok(None);
                        }
                        let info =
                            Info::decode(&theirs.bytes).map_err(|why| NetError::Refused {
                                peer: peer.to_string(),
                                reason: why,
                            })?;
                        if info.qps.len() != link.qps.len() {
                            return Err(NetError::Refused {
                                peer: peer.to_string(),
                                reason: format!(
                                    "it set up {} queue pairs for our {}",
                                    info.qps.len(),
                                    link.qps.len()
                                ),
                            });
                        }
                        link.connect(&info)
                            .map_err(|e| verbs_error("connecting to", &peer.to_string(), &e))?;
                        *sizes = (info.addr, info.rkey);
                        *ready = Some(Partial::to_write(vec![1]));
                    }
                    if !ready.as_mut().expect("set").write(stream).map_err(io_err)? {
                        return Ok(None);
                    }
                    let Some(ConnectStep::Details {
                        stream,
                        mut link,
                        sizes,
                        ..
                    }) = stage.step.take()
                    else {
                        unreachable!("in the exchange")
                    };
                    link.control = Some(stream);
                    return Ok(Some(IbSend {
                        peer: peer.to_string(),
                        state: Arc::new(Mutex::new(SendState {
                            link: *link,
                            sizes_addr: sizes.0,
                            sizes_rkey: sizes.1,
                            ops: Posted::new(),
                            next_match: 0,
                            slot: 0,
                            entries: Vec::new(),
                            signals: VecDeque::new(),
                        })),
                    }));
                }
            }
        }
    }

    /// Moves one accepted connection along: the receiving communicator
    /// once it is set up; `Err` with why it was dropped.
    pub(super) fn accept_step(
        &self,
        dev: usize,
        id: &[u8; LISTENER_ID],
        accepting: &mut Accepting,
    ) -> Result<Option<IbRecv>, String> {
        loop {
            let step = std::mem::replace(&mut accepting.step, AcceptStep::Failed);
            accepting.step = match step {
                AcceptStep::Handshake(mut server) => match server.progress(&self.secret, id) {
                    Ok(false) => {
                        accepting.step = AcceptStep::Handshake(server);
                        return Ok(None);
                    }
                    Ok(true) => AcceptStep::Details {
                        stream: server.into_stream().into_tcp(),
                        theirs: Partial::to_read(INFO_LEN),
                    },
                    Err(e) => return Err(format!("the handshake failed: {e}")),
                },
                AcceptStep::Details { stream, mut theirs } => {
                    if !theirs.read(&stream).map_err(|e| e.to_string())? {
                        accepting.step = AcceptStep::Details { stream, theirs };
                        return Ok(None);
                    }
                    let info = Info::decode(&theirs.bytes)?;
                    let mut link = self
                        .resources(dev, info.qps.len(), Area::sizes())
                        .map_err(|e| e.to_string())?;
                    link.peer = accepting.peer.to_string();
                    link.connect(&info).map_err(|e| e.to_string())?;
                    AcceptStep::Answer {
                        stream,
                        ours: Partial::to_write(Info::of(&link).encode()),
                        link: Box::new(link),
                        fifo: (info.addr, info.rkey),
                        ready: Partial::to_read(1),
                    }
                }
                AcceptStep::Answer {
                    stream,
                    mut link,
                    fifo,
                    mut ours,
                    mut ready,
                } => {
                    let done = ours.write(&stream).map_err(|e| e.to_string())?
                        && ready.read(&stream).map_err(|e| e.to_string())?;
                    if !done {
                        accepting.step = AcceptStep::Answer {
                            stream,
                            link,
                            fifo,
                            ours,
                            ready,
                        };
                        return Ok(None);
                    }
                    link.control = Some(stream);
                    let peer = link.peer.clone();
                    return Ok(Some(IbRecv {
                        peer,
                        state: Arc::new(Mutex::new(RecvState {
                            link: *link,
                            fifo_addr: fifo.0,
                            fifo_rkey: fifo.1,
                            groups: Posted::new(),
                            max_recvs: MAX_RECVS,
                        })),
                    }));
                }
                AcceptStep::Failed => return Err("a failed connection".into()),
            };
        }
    }
}
