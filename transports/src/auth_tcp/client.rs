//! The client's side: connecting (retrying a listener not up yet or one
//! that shed the handshake), proving the secret, checking the listener's
//! proof, and sending the hello.

use super::*;

pub(super) fn set_write_deadline(stream: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_write_timeout(Some(left))
}

/// Connects to `addr`, proves knowledge of `secret` (and checks that the
/// listener knows it too), then sends `hello` (an opaque purpose payload,
/// at most [`MAX_HELLO`] bytes).
///
/// A refused connection is retried with a short backoff until `deadline`
/// (the listener may not be up yet), and so is one the listener drops
/// after its greeting without refusing our proof (a busy listener sheds
/// its oldest unauthenticated handshakes); other failures, a refused proof
/// among them, are returned at once. The stream comes back blocking,
/// without timeouts, with `TCP_NODELAY`.
pub fn connect(
    addr: SocketAddr,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
) -> io::Result<TcpStream> {
    connect_until(addr, secret, hello, deadline, &NEVER)
}

/// [`connect`] that also gives up with `Interrupted` soon after `stop`
/// becomes true.
pub fn connect_until(
    addr: SocketAddr,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<TcpStream> {
    if hello.len() > MAX_HELLO {
        return Err(err(
            io::ErrorKind::InvalidInput,
            format!("hello of {} bytes exceeds {MAX_HELLO}", hello.len()),
        ));
    }
    let mut backoff = Duration::from_millis(5);
    loop {
        let mut stream = connect_tcp(addr, deadline, stop, &mut backoff)?;
        match client_handshake(&mut stream, secret, hello, deadline, stop) {
            Ok(()) => return Ok(stream),
            Err(Attempt::Final(e)) => {
                return Err(context(e, format_args!("handshake with {addr}")))
            }
            Err(Attempt::Dropped(e)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(context(e, format_args!("handshake with {addr}")));
                }
                back_off(&mut backoff, left);
            }
        }
    }
}

/// Sleeps `backoff` (at most `left`), then doubles it, up to 100 ms.
pub(super) fn back_off(backoff: &mut Duration, left: Duration) {
    std::thread::sleep((*backoff).min(left));
    *backoff = (*backoff * 2).min(Duration::from_millis(100));
}

/// Opens the TCP connection, retrying refusals until `deadline`.
pub(super) fn connect_tcp(
    addr: SocketAddr,
    deadline: Instant,
    stop: &AtomicBool,
    backoff: &mut Duration,
) -> io::Result<TcpStream> {
    loop {
        if stop.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out(&format!("connecting to {addr}")));
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(context(e, format_args!("connecting to {addr}")));
                }
                back_off(backoff, left);
            }
            Err(e) => return Err(context(e, format_args!("connecting to {addr}"))),
        }
    }
}

/// How a client's handshake attempt failed.
pub(super) enum Attempt {
    /// The listener greeted us, then closed the connection without
    /// refusing our proof: it shed the handshake; another try may pass.
    Dropped(io::Error),
    Final(io::Error),
}

impl From<io::Error> for Attempt {
    fn from(e: io::Error) -> Attempt {
        Attempt::Final(e)
    }
}

pub(super) fn client_handshake(
    stream: &mut TcpStream,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<(), Attempt> {
    stream.set_nodelay(true)?;
    set_write_deadline(stream, deadline)?;
    // A listener greets as soon as it accepts; on a loaded host that may
    // take a while, so wait until the deadline.
    let mut greeting = [0u8; GREETING_LEN];
    read_exact_until(stream, &mut greeting, deadline, stop)?;
    check_header(&greeting, "listener")?;
    let server_nonce = &greeting[12..];
    let client_nonce = nonce()?;
    let tag = mac(secret, CLIENT_LABEL, server_nonce, &client_nonce)
        .finalize()
        .into_bytes();
    let mut response = [0u8; RESPONSE_LEN];
    response[..8].copy_from_slice(&MAGIC);
    response[8..12].copy_from_slice(&VERSION.to_le_bytes());
    response[12..12 + NONCE_LEN].copy_from_slice(&client_nonce);
    response[12 + NONCE_LEN..].copy_from_slice(&tag);
    let dropped = |e: io::Error| {
        if matches!(
            e.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
        ) {
            Attempt::Dropped(err(
                e.kind(),
                format!("the listener dropped the connection before authenticating it: {e}"),
            ))
        } else {
            Attempt::Final(e)
        }
    };
    stream.write_all(&response).map_err(dropped)?;
    let proof_deadline = deadline.min(Instant::now() + DEFAULT_HANDSHAKE_TIMEOUT);
    let mut proof = [0u8; MAC_LEN];
    read_exact_until(stream, &mut proof, proof_deadline, stop).map_err(dropped)?;
    if proof == DENIED {
        return Err(Attempt::Final(err(
            io::ErrorKind::PermissionDenied,
            "the listener refused this connection's proof: it serves a different secret",
        )));
    }
    mac(secret, SERVER_LABEL, server_nonce, &client_nonce)
        .verify_slice(&proof)
        .map_err(|_| {
            err(
                io::ErrorKind::PermissionDenied,
                "the listener failed to prove it knows the secret",
            )
        })?;
    write_frame(stream, hello)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(())
}
