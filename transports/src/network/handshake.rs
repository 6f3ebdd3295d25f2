//! The handshake of [`crate::auth_tcp`] (HMAC-SHA256, or Noise when the
//! connection is encrypted), as state machines that never block: each
//! `progress` call moves as far as the socket allows and says whether the
//! handshake is done.
//!
//! The messages and their order are those of [`crate::auth_tcp`] (greeting,
//! response, proof, hello), so the secret never crosses the wire and
//! nothing is sent to a listener before it has proved it knows the secret.
//! The hello is the listener's id, so a connection reaches the one listening
//! communicator whose handle the sender was given.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use crate::auth_tcp::sides::{ClientSide, ServerSide};
use crate::auth_tcp::{AuthStream, Psk, Secret};
use crate::tcp_connect::connected;

/// Bytes of a listener's id: the hello a connecting side sends.
pub(crate) const LISTENER_ID: usize = 16;

/// Bytes moved so far of a message of known length.
pub(crate) struct Partial {
    pub(crate) bytes: Vec<u8>,
    done: usize,
}

impl Partial {
    pub(crate) fn to_read(len: usize) -> Partial {
        Partial {
            bytes: vec![0; len],
            done: 0,
        }
    }

    /// Reads the rest of `bytes`, of which `done` are in.
    pub(crate) fn resume_read(bytes: Vec<u8>, done: usize) -> Partial {
        Partial { bytes, done }
    }

    pub(crate) fn to_write(bytes: Vec<u8>) -> Partial {
        Partial { bytes, done: 0 }
    }

    /// Reads what the socket has, up to the message's end: whether the
    /// message is complete.
    pub(crate) fn read(&mut self, mut stream: &TcpStream) -> io::Result<bool> {
        while self.done < self.bytes.len() {
            match stream.read(&mut self.bytes[self.done..]) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!(
                            "connection closed by the peer ({} of {} bytes received)",
                            self.done,
                            self.bytes.len()
                        ),
                    ))
                }
                Ok(n) => self.done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Writes what the socket takes: whether the message is all sent.
    pub(crate) fn write(&mut self, mut stream: &TcpStream) -> io::Result<bool> {
        while self.done < self.bytes.len() {
            match stream.write(&self.bytes[self.done..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

fn refused(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why.to_string())
}

enum ClientStep {
    Connecting,
    Greeting,
    GreetingRest,
    Response,
    Proof,
    Hello,
}

/// The connecting side of a handshake.
pub(crate) struct Client {
    stream: TcpStream,
    step: ClientStep,
    io: Partial,
    side: ClientSide,
    id: [u8; LISTENER_ID],
}

impl Client {
    /// A handshake on a connection being established, that will present
    /// listener `id`, encrypted with `psk` (plaintext with `None`).
    pub(crate) fn new(stream: TcpStream, id: [u8; LISTENER_ID], psk: Option<Psk>) -> Client {
        Client {
            stream,
            step: ClientStep::Connecting,
            io: Partial::to_read(0),
            side: ClientSide::new(psk),
            id,
        }
    }

    /// Moves the handshake as far as the socket allows: `true` once the
    /// listener has proved it knows `secret` and the hello is sent.
    pub(crate) fn progress(&mut self, secret: &Secret) -> io::Result<bool> {
        loop {
            match self.step {
                ClientStep::Connecting => {
                    if !connected(&self.stream)? {
                        return Ok(false);
                    }
                    self.step = ClientStep::Greeting;
                    self.io = Partial::to_read(ClientSide::GREETING_PROBE);
                }
                ClientStep::Greeting => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    let rest = self.side.greeting_rest(&self.io.bytes)?;
                    let mut greeting = std::mem::take(&mut self.io.bytes);
                    greeting.resize(ClientSide::GREETING_PROBE + rest, 0);
                    self.io = Partial::resume_read(greeting, ClientSide::GREETING_PROBE);
                    self.step = ClientStep::GreetingRest;
                }
                ClientStep::GreetingRest => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    let response = self.side.respond(secret, &self.io.bytes)?;
                    self.io = Partial::to_write(response);
                    self.step = ClientStep::Response;
                }
                ClientStep::Response => {
                    if !self.io.write(&self.stream)? {
                        return Ok(false);
                    }
                    self.io = Partial::to_read(self.side.proof_len());
                    self.step = ClientStep::Proof;
                }
                ClientStep::Proof => {
                    match self.io.read(&self.stream) {
                        Ok(true) => {}
                        Ok(false) => return Ok(false),
                        Err(e)
                            if matches!(
                                e.kind(),
                                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
                            ) =>
                        {
                            return Err(refused(
                                "the listener closed the connection during authentication (wrong secret?)",
                            ))
                        }
                        Err(e) => return Err(e),
                    }
                    self.side
                        .check_proof(secret, &self.io.bytes)
                        .map_err(|e| refused(&e.to_string()))?;
                    self.io = Partial::to_write(self.side.hello_message(&self.id)?);
                    self.step = ClientStep::Hello;
                }
                ClientStep::Hello => return self.io.write(&self.stream),
            }
        }
    }

    /// The connection, once [`Client::progress`] said done.
    pub(crate) fn into_stream(self) -> AuthStream {
        self.side.into_stream(self.stream)
    }
}

enum ServerStep {
    Greeting,
    Response,
    Proof,
    HelloLength,
    Hello,
}

/// The listening side of a handshake with one accepted connection.
pub(crate) struct Server {
    stream: TcpStream,
    peer: SocketAddr,
    step: ServerStep,
    io: Partial,
    side: ServerSide,
    /// When the client must have finished.
    pub(crate) deadline: Instant,
}

impl Server {
    /// A handshake with `stream`, just accepted from `peer`, encrypted with
    /// `psk` (plaintext with `None`): the greeting goes out first.
    pub(crate) fn new(
        stream: TcpStream,
        peer: SocketAddr,
        deadline: Instant,
        secret: &Secret,
        psk: Option<&Psk>,
    ) -> io::Result<Server> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let (side, greeting) = ServerSide::start(secret, psk)?;
        Ok(Server {
            stream,
            peer,
            step: ServerStep::Greeting,
            io: Partial::to_write(greeting),
            side,
            deadline,
        })
    }

    /// The client's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Moves the handshake as far as the socket allows: `true` once the
    /// client proved it knows `secret` and presented listener `id`.
    pub(crate) fn progress(&mut self, secret: &Secret, id: &[u8; LISTENER_ID]) -> io::Result<bool> {
        loop {
            match self.step {
                ServerStep::Greeting => {
                    if !self.io.write(&self.stream)? {
                        return Ok(false);
                    }
                    self.io = Partial::to_read(self.side.response_len());
                    self.step = ServerStep::Response;
                }
                ServerStep::Response => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    let proof = self
                        .side
                        .check_response(secret, &self.io.bytes)
                        .map_err(|refusal| refusal.error)?;
                    self.io = Partial::to_write(proof);
                    self.step = ServerStep::Proof;
                }
                ServerStep::Proof => {
                    if !self.io.write(&self.stream)? {
                        return Ok(false);
                    }
                    self.io = Partial::to_read(self.side.hello_header_len());
                    self.step = ServerStep::HelloLength;
                }
                ServerStep::HelloLength => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    let len = self.side.hello_len(&self.io.bytes, LISTENER_ID)?;
                    self.io = Partial::to_read(len);
                    self.step = ServerStep::Hello;
                }
                ServerStep::Hello => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    let hello = self.side.open_hello(std::mem::take(&mut self.io.bytes))?;
                    if hello != id {
                        return Err(refused("the client asked for another listener"));
                    }
                    return Ok(true);
                }
            }
        }
    }

    /// The connection, once [`Server::progress`] said done.
    pub(crate) fn into_stream(self) -> AuthStream {
        self.side.into_stream(self.stream)
    }
}
