//! The mutual HMAC-SHA256 handshake of [`crate::auth_tcp`], as state machines
//! that never block: each `progress` call moves as far as the socket allows
//! and says whether the handshake is done.
//!
//! The messages and their order are those of [`crate::auth_tcp`] (greeting,
//! response, proof, hello), so the secret never crosses the wire and
//! nothing is sent to a listener before it has proved it knows the secret.
//! The hello is the listener's id, so a connection reaches the one listening
//! communicator whose handle the sender was given.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use hmac::Mac;

use crate::auth_tcp::{
    check_header, mac, nonce, write_frame, Secret, CLIENT_LABEL, GREETING_LEN, MAC_LEN, MAGIC,
    NONCE_LEN, RESPONSE_LEN, SERVER_LABEL, VERSION,
};
use crate::tcp_connect::connected;

/// Bytes of a listener's id: the hello a connecting side sends.
pub(crate) const LISTENER_ID: usize = 16;

/// Bytes of the hello frame: its length, then the id.
const HELLO_FRAME: usize = 4 + LISTENER_ID;

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
    Response,
    Proof,
    Hello,
}

/// The connecting side of a handshake.
pub(crate) struct Client {
    stream: TcpStream,
    step: ClientStep,
    io: Partial,
    server_nonce: [u8; NONCE_LEN],
    client_nonce: [u8; NONCE_LEN],
    id: [u8; LISTENER_ID],
}

impl Client {
    /// A handshake on a connection being established, that will present
    /// listener `id`.
    pub(crate) fn new(stream: TcpStream, id: [u8; LISTENER_ID]) -> Client {
        Client {
            stream,
            step: ClientStep::Connecting,
            io: Partial::to_read(0),
            server_nonce: [0; NONCE_LEN],
            client_nonce: [0; NONCE_LEN],
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
                    self.io = Partial::to_read(GREETING_LEN);
                }
                ClientStep::Greeting => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    check_header(&self.io.bytes, "listener")?;
                    self.server_nonce.copy_from_slice(&self.io.bytes[12..]);
                    self.client_nonce = nonce()?;
                    let tag = mac(secret, CLIENT_LABEL, &self.server_nonce, &self.client_nonce)
                        .finalize()
                        .into_bytes();
                    let mut response = Vec::with_capacity(RESPONSE_LEN);
                    response.extend_from_slice(&MAGIC);
                    response.extend_from_slice(&VERSION.to_le_bytes());
                    response.extend_from_slice(&self.client_nonce);
                    response.extend_from_slice(&tag);
                    self.io = Partial::to_write(response);
                    self.step = ClientStep::Response;
                }
                ClientStep::Response => {
                    if !self.io.write(&self.stream)? {
                        return Ok(false);
                    }
                    self.io = Partial::to_read(MAC_LEN);
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
                    mac(secret, SERVER_LABEL, &self.server_nonce, &self.client_nonce)
                        .verify_slice(&self.io.bytes)
                        .map_err(|_| refused("the listener failed to prove it knows the secret"))?;
                    let mut hello = Vec::with_capacity(HELLO_FRAME);
                    write_frame(&mut hello, &self.id)?;
                    self.io = Partial::to_write(hello);
                    self.step = ClientStep::Hello;
                }
                ClientStep::Hello => return self.io.write(&self.stream),
            }
        }
    }

    /// The connection, once [`Client::progress`] said done.
    pub(crate) fn into_stream(self) -> TcpStream {
        self.stream
    }
}

enum ServerStep {
    Greeting,
    Response,
    Proof,
    Hello,
}

/// The listening side of a handshake with one accepted connection.
pub(crate) struct Server {
    stream: TcpStream,
    peer: SocketAddr,
    step: ServerStep,
    io: Partial,
    server_nonce: [u8; NONCE_LEN],
    /// When the client must have finished.
    pub(crate) deadline: Instant,
}

impl Server {
    /// A handshake with `stream`, just accepted from `peer`: the greeting
    /// goes out first.
    pub(crate) fn new(
        stream: TcpStream,
        peer: SocketAddr,
        deadline: Instant,
    ) -> io::Result<Server> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let server_nonce = nonce()?;
        let mut greeting = Vec::with_capacity(GREETING_LEN);
        greeting.extend_from_slice(&MAGIC);
        greeting.extend_from_slice(&VERSION.to_le_bytes());
        greeting.extend_from_slice(&server_nonce);
        Ok(Server {
            stream,
            peer,
            step: ServerStep::Greeting,
            io: Partial::to_write(greeting),
            server_nonce,
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
                    self.io = Partial::to_read(RESPONSE_LEN);
                    self.step = ServerStep::Response;
                }
                ServerStep::Response => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    let response = &self.io.bytes;
                    check_header(response, "client")?;
                    let client_nonce = &response[12..12 + NONCE_LEN];
                    mac(secret, CLIENT_LABEL, &self.server_nonce, client_nonce)
                        .verify_slice(&response[12 + NONCE_LEN..])
                        .map_err(|_| refused("authentication failed (wrong secret)"))?;
                    let proof = mac(secret, SERVER_LABEL, &self.server_nonce, client_nonce)
                        .finalize()
                        .into_bytes();
                    self.io = Partial::to_write(proof.to_vec());
                    self.step = ServerStep::Proof;
                }
                ServerStep::Proof => {
                    if !self.io.write(&self.stream)? {
                        return Ok(false);
                    }
                    self.io = Partial::to_read(HELLO_FRAME);
                    self.step = ServerStep::Hello;
                }
                ServerStep::Hello => {
                    if !self.io.read(&self.stream)? {
                        return Ok(false);
                    }
                    let hello = crate::auth_tcp::read_frame(&mut &self.io.bytes[..], LISTENER_ID)?;
                    if hello != id {
                        return Err(refused("the client asked for another listener"));
                    }
                    return Ok(true);
                }
            }
        }
    }

    /// The connection, once [`Server::progress`] said done.
    pub(crate) fn into_stream(self) -> TcpStream {
        self.stream
    }
}
