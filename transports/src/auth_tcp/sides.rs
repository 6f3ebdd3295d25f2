//! The two sides of a handshake as message makers and checkers, plaintext
//! (HMAC challenge-response) or encrypted (Noise, [`super::seal`]): the
//! drivers (blocking, non-blocking, and the network's) only move the bytes
//! these ask for. Both protocols have the same four messages: greeting,
//! response, proof, hello.

use super::seal::{noise_answer, record_len, NoiseListener, Psk, Seal, ACCEPT_LEN};
use super::seal::{NOISE_MSG_LEN, RECORD_HEADER};
use super::*;

/// The listener's side of one handshake.
pub(crate) enum ServerSide {
    Mac { nonce: [u8; NONCE_LEN] },
    Noise(Option<NoiseListener>),
    Sealed(Box<Seal>),
}

/// Why a listener refuses a client, and what it tells the client.
pub(crate) struct Refusal {
    pub(crate) error: io::Error,
    /// Bytes to send before closing (the plaintext protocol's denial).
    pub(crate) answer: Option<&'static [u8]>,
}

impl ServerSide {
    /// Starts a handshake: the side and its greeting.
    pub(crate) fn start(secret: &Secret, psk: Option<&Psk>) -> io::Result<(ServerSide, Vec<u8>)> {
        if let Some(psk) = psk {
            let (noise, greeting) = NoiseListener::start(psk, secret)?;
            return Ok((ServerSide::Noise(Some(noise)), greeting));
        }
        let nonce = nonce()?;
        let mut greeting = Vec::with_capacity(GREETING_LEN);
        greeting.extend_from_slice(&MAGIC);
        greeting.extend_from_slice(&VERSION.to_le_bytes());
        greeting.extend_from_slice(&nonce);
        Ok((ServerSide::Mac { nonce }, greeting))
    }

    /// Bytes of the client's response.
    pub(crate) fn response_len(&self) -> usize {
        match self {
            ServerSide::Mac { .. } => RESPONSE_LEN,
            _ => NOISE_MSG_LEN,
        }
    }

    /// Checks the client's response: the proof to send back.
    pub(crate) fn check_response(
        &mut self,
        secret: &Secret,
        response: &[u8],
    ) -> Result<Vec<u8>, Refusal> {
        let refuse = |error| Refusal {
            error,
            answer: None,
        };
        match self {
            ServerSide::Mac { nonce } => {
                check_header(response, "client").map_err(refuse)?;
                let client_nonce = &response[12..12 + NONCE_LEN];
                if mac(secret, CLIENT_LABEL, nonce, client_nonce)
                    .verify_slice(&response[12 + NONCE_LEN..])
                    .is_err()
                {
                    return Err(Refusal {
                        error: err(
                            io::ErrorKind::PermissionDenied,
                            "authentication failed (wrong secret)",
                        ),
                        answer: Some(&DENIED),
                    });
                }
                let proof = mac(secret, SERVER_LABEL, nonce, client_nonce).finalize();
                Ok(proof.into_bytes().to_vec())
            }
            ServerSide::Noise(noise) => {
                let noise = noise.take().expect("one response per handshake");
                let (seal, accept) = noise.finish(response).map_err(refuse)?;
                *self = ServerSide::Sealed(Box::new(seal));
                Ok(accept)
            }
            ServerSide::Sealed(_) => unreachable!("one response per handshake"),
        }
    }

    /// Bytes of the hello's length field.
    pub(crate) fn hello_header_len(&self) -> usize {
        match self {
            ServerSide::Mac { .. } => 4,
            _ => RECORD_HEADER,
        }
    }

    /// Bytes of the hello that `header` announces, checked.
    pub(crate) fn hello_len(&self, header: &[u8], max_hello: usize) -> io::Result<usize> {
        match self {
            ServerSide::Mac { .. } => {
                frame::check_len(header.try_into().expect("4 bytes"), max_hello)
            }
            _ => {
                let len = record_len(header.try_into().expect("2 bytes"))?;
                frame::check_len((len as u32).to_le_bytes(), max_hello + ACCEPT_LEN)
            }
        }
    }

    /// The hello from its bytes on the wire.
    pub(crate) fn open_hello(&mut self, body: Vec<u8>) -> io::Result<Vec<u8>> {
        match self {
            ServerSide::Sealed(seal) => seal.open(&body),
            _ => Ok(body),
        }
    }

    /// The connection, once the hello is in.
    pub(crate) fn into_stream(self, stream: TcpStream) -> AuthStream {
        match self {
            ServerSide::Sealed(seal) => AuthStream::new(stream, Some(seal)),
            _ => AuthStream::new(stream, None),
        }
    }
}

/// The connecting side of one handshake.
pub(crate) enum ClientSide {
    Mac {
        server_nonce: [u8; NONCE_LEN],
        client_nonce: [u8; NONCE_LEN],
    },
    Noise(Psk),
    Sealed(Box<Seal>),
}

impl ClientSide {
    pub(crate) fn new(psk: Option<Psk>) -> ClientSide {
        match psk {
            Some(psk) => ClientSide::Noise(psk),
            None => ClientSide::Mac {
                server_nonce: [0; NONCE_LEN],
                client_nonce: [0; NONCE_LEN],
            },
        }
    }

    /// Bytes of the greeting to read first: the plaintext greeting's, so
    /// that a side of each kind can tell the other kind.
    pub(crate) const GREETING_PROBE: usize = GREETING_LEN;

    /// Checks the first [`ClientSide::GREETING_PROBE`] bytes of the
    /// greeting: how many more it has.
    pub(crate) fn greeting_rest(&self, probe: &[u8]) -> io::Result<usize> {
        match self {
            ClientSide::Noise(_) if probe[..8] == MAGIC => Err(err(
                io::ErrorKind::PermissionDenied,
                "the listener does not encrypt its connections and this process does: \
                 every process must make the same ncclSetEncryption call",
            )),
            ClientSide::Noise(_) => Ok(NOISE_MSG_LEN - GREETING_LEN),
            _ => check_header(probe, "listener").map(|()| 0),
        }
    }

    /// The response to the whole greeting.
    pub(crate) fn respond(&mut self, secret: &Secret, greeting: &[u8]) -> io::Result<Vec<u8>> {
        match self {
            ClientSide::Mac {
                server_nonce,
                client_nonce,
            } => {
                server_nonce.copy_from_slice(&greeting[12..]);
                *client_nonce = nonce()?;
                let tag = mac(secret, CLIENT_LABEL, server_nonce, client_nonce).finalize();
                let mut response = Vec::with_capacity(RESPONSE_LEN);
                response.extend_from_slice(&MAGIC);
                response.extend_from_slice(&VERSION.to_le_bytes());
                response.extend_from_slice(client_nonce);
                response.extend_from_slice(&tag.into_bytes());
                Ok(response)
            }
            ClientSide::Noise(psk) => {
                let (seal, answer) = noise_answer(psk, secret, greeting)?;
                *self = ClientSide::Sealed(Box::new(seal));
                Ok(answer)
            }
            ClientSide::Sealed(_) => unreachable!("one greeting per handshake"),
        }
    }

    /// Bytes of the listener's proof.
    pub(crate) fn proof_len(&self) -> usize {
        match self {
            ClientSide::Mac { .. } => MAC_LEN,
            _ => ACCEPT_LEN,
        }
    }

    /// Checks the listener's proof.
    pub(crate) fn check_proof(&mut self, secret: &Secret, proof: &[u8]) -> io::Result<()> {
        match self {
            ClientSide::Mac {
                server_nonce,
                client_nonce,
            } => {
                if proof == DENIED {
                    return Err(err(
                        io::ErrorKind::PermissionDenied,
                        "the listener refused this connection's proof: it serves a different secret",
                    ));
                }
                mac(secret, SERVER_LABEL, server_nonce, client_nonce)
                    .verify_slice(proof)
                    .map_err(|_| {
                        err(
                            io::ErrorKind::PermissionDenied,
                            "the listener failed to prove it knows the secret",
                        )
                    })
            }
            ClientSide::Sealed(seal) => {
                let header = [proof[0], proof[1]];
                if record_len(header)? != proof.len() - RECORD_HEADER {
                    return Err(err(
                        io::ErrorKind::InvalidData,
                        "the listener's acceptance has the wrong length",
                    ));
                }
                seal.open(&proof[RECORD_HEADER..]).map(drop)
            }
            ClientSide::Noise(_) => unreachable!("the proof follows the greeting"),
        }
    }

    /// The hello as it goes on the wire.
    pub(crate) fn hello_message(&mut self, hello: &[u8]) -> io::Result<Vec<u8>> {
        match self {
            ClientSide::Sealed(seal) => seal.record(hello),
            _ => {
                let mut frame = Vec::with_capacity(4 + hello.len());
                write_frame(&mut frame, hello)?;
                Ok(frame)
            }
        }
    }

    /// The connection, once the hello is sent.
    pub(crate) fn into_stream(self, stream: TcpStream) -> AuthStream {
        match self {
            ClientSide::Sealed(seal) => AuthStream::new(stream, Some(seal)),
            _ => AuthStream::new(stream, None),
        }
    }
}
