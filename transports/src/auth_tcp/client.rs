//! The client's side: connecting (retrying a listener not up yet or one
//! that shed the handshake), proving the secret, checking the listener's
//! proof, and sending the hello.

use super::sides::ClientSide;
use super::*;

pub(super) fn set_write_deadline(stream: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_write_timeout(Some(left))
}

/// Connects to `addr`, proves knowledge of `secret` (and checks that the
/// listener knows it too), then sends `hello` (an opaque purpose payload,
/// at most [`MAX_HELLO`] bytes). The connection is encrypted when the
/// process holds a PSK ([`super::encryption`]).
///
/// A refused connection is retried with a short backoff until `deadline`
/// (the listener may not be up yet), and so is one the listener drops
/// after its greeting without refusing our proof (a busy listener sheds
/// its oldest unauthenticated handshakes); other failures, a refused proof
/// or another key among them, are returned at once. The stream comes back
/// blocking, without timeouts, with `TCP_NODELAY`.
pub fn connect(
    addr: SocketAddr,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
) -> io::Result<AuthStream> {
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
) -> io::Result<AuthStream> {
    connect_with(addr, secret, encryption().as_ref(), hello, deadline, stop)
}

/// [`connect_until`] encrypting with `psk` (plaintext with `None`) rather
/// than with the process's key.
pub fn connect_with(
    addr: SocketAddr,
    secret: &Secret,
    psk: Option<&Psk>,
    hello: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<AuthStream> {
    if hello.len() > MAX_HELLO {
        return Err(err(
            io::ErrorKind::InvalidInput,
            format!("hello of {} bytes exceeds {MAX_HELLO}", hello.len()),
        ));
    }
    let mut backoff = Duration::from_millis(5);
    loop {
        let mut stream = connect_tcp(addr, deadline, stop, &mut backoff)?;
        let mut side = ClientSide::new(psk.cloned());
        match client_handshake(&mut stream, &mut side, secret, hello, deadline, stop) {
            Ok(()) => return Ok(side.into_stream(stream)),
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
    side: &mut ClientSide,
    secret: &Secret,
    hello: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> Result<(), Attempt> {
    stream.set_nodelay(true)?;
    set_write_deadline(stream, deadline)?;
    // A listener greets as soon as it accepts; on a loaded host that may
    // take a while, so wait until the deadline.
    let mut greeting = vec![0u8; ClientSide::GREETING_PROBE];
    read_exact_until(stream, &mut greeting, deadline, stop)?;
    let rest = side.greeting_rest(&greeting)?;
    greeting.resize(ClientSide::GREETING_PROBE + rest, 0);
    read_exact_until(
        stream,
        &mut greeting[ClientSide::GREETING_PROBE..],
        deadline,
        stop,
    )?;
    let response = side.respond(secret, &greeting)?;
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
    let mut proof = vec![0u8; side.proof_len()];
    read_exact_until(stream, &mut proof, proof_deadline, stop).map_err(dropped)?;
    side.check_proof(secret, &proof)?;
    stream.write_all(&side.hello_message(hello)?)?;
    stream.set_read_timeout(None)?;
    stream.set_write_timeout(None)?;
    Ok(())
}
