//! Length-prefixed frames, read against a deadline and a stop flag
//! without losing partial reads.

use super::*;

/// A stream whose reads can time out: a TCP stream or an
/// [`AuthStream`].
pub trait TimedRead: Read {
    /// The stream's read timeout (`None`: block).
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()>;
}

impl TimedRead for TcpStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        TcpStream::set_read_timeout(self, timeout)
    }
}

impl TimedRead for AuthStream {
    fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        self.tcp().set_read_timeout(timeout)
    }
}

/// Reads exactly `buf.len()` bytes, giving up with `TimedOut` at `deadline`
/// and with `Interrupted` soon after `stop` becomes true. The stream's read
/// timeout is changed; partial reads are never lost.
pub fn read_exact_until(
    stream: &mut impl TimedRead,
    buf: &mut [u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        if stop.load(Ordering::Relaxed) {
            return Err(interrupted());
        }
        if Instant::now() >= deadline {
            return Err(timed_out(&format!(
                "reading ({filled} of {} bytes received)",
                buf.len()
            )));
        }
        stream.set_read_timeout(Some(slice_until(deadline)))?;
        match stream.read(&mut buf[filled..]) {
            Ok(0) => {
                return Err(err(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed by the peer ({filled} of {} bytes received)",
                        buf.len()
                    ),
                ))
            }
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// [`read_frame`] with a deadline and a stop flag, as [`read_exact_until`].
pub fn read_frame_until(
    stream: &mut impl TimedRead,
    max_len: usize,
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<Vec<u8>> {
    let mut header = [0u8; 4];
    read_exact_until(stream, &mut header, deadline, stop)?;
    let len = check_len(header, max_len)?;
    let mut payload = vec![0u8; len];
    read_exact_until(stream, &mut payload, deadline, stop)?;
    Ok(payload)
}

pub(super) fn check_len(header: [u8; 4], max_len: usize) -> io::Result<usize> {
    let len = u32::from_le_bytes(header) as usize;
    if len > max_len {
        return Err(err(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the limit of {max_len} bytes"),
        ));
    }
    Ok(len)
}

/// Writes one frame: the payload's length as a little-endian `u32`, then
/// the payload.
pub fn write_frame(stream: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len()).map_err(|_| {
        err(
            io::ErrorKind::InvalidInput,
            format!("frame of {} bytes is too long", payload.len()),
        )
    })?;
    if payload.len() <= 64 * 1024 {
        // One write, so a small frame leaves in one segment.
        let mut buf = Vec::with_capacity(4 + payload.len());
        buf.extend_from_slice(&len.to_le_bytes());
        buf.extend_from_slice(payload);
        stream.write_all(&buf)
    } else {
        stream.write_all(&len.to_le_bytes())?;
        stream.write_all(payload)
    }
}

/// Reads one frame written by [`write_frame`]. A length above `max_len` is
/// refused with `InvalidData` before anything is allocated; the payload
/// buffer grows in steps as data arrives and never exceeds `max_len`.
pub fn read_frame(stream: &mut impl Read, max_len: usize) -> io::Result<Vec<u8>> {
    const STEP: usize = 1 << 20;
    let mut header = [0u8; 4];
    stream.read_exact(&mut header)?;
    let len = check_len(header, max_len)?;
    let mut payload = Vec::new();
    while payload.len() < len {
        let start = payload.len();
        let step = (len - start).min(STEP);
        payload.reserve_exact(step);
        payload.resize(start + step, 0);
        stream.read_exact(&mut payload[start..])?;
    }
    Ok(payload)
}
