//! Hang reports on a signal: `kill -USR1 <pid>` prints what every live
//! communicator of the process is doing to standard error.
//!
//! The handler only writes one byte to a pipe (async-signal-safe); a
//! watcher thread blocked on the pipe's other end builds and prints the
//! report. Enabled by [`report_hangs_on_signal`], or at the first
//! communicator's init by `RCCL_HANG_REPORT_SIGNAL` (`USR1`, `SIGUSR2`, a
//! number).

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use crate::error::{Error, Result};

/// The pipe's write end, for the handler; -1 before installation.
static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);
/// Signals with the handler installed.
static INSTALLED: Mutex<Vec<i32>> = Mutex::new(Vec::new());

extern "C" fn on_signal(_: libc::c_int) {
    let fd = PIPE_WRITE.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: write(2) is async-signal-safe; the pipe stays open for
        // the life of the process and is non-blocking (a full pipe already
        // has a report pending).
        unsafe { libc::write(fd, (&byte as *const u8).cast(), 1) };
    }
}

/// Prints [`crate::hang_report`] to standard error whenever the process
/// receives `signal` (e.g. `libc::SIGUSR1`), replacing that signal's
/// previous disposition. Idempotent.
pub fn report_hangs_on_signal(signal: i32) -> Result<()> {
    let mut installed = INSTALLED.lock().unwrap_or_else(|e| e.into_inner());
    if installed.contains(&signal) {
        return Ok(());
    }
    if PIPE_WRITE.load(Ordering::Relaxed) < 0 {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two ints.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(Error::io(
                "hang report pipe",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fds[1] is the pipe's write end, just opened.
        unsafe { libc::fcntl(fds[1], libc::F_SETFL, libc::O_NONBLOCK) };
        let read_end = fds[0];
        std::thread::Builder::new()
            .name("rccl-hang-report".into())
            .spawn(move || watch(read_end))
            .map_err(|e| Error::io("starting the hang report thread", e))?;
        PIPE_WRITE.store(fds[1], Ordering::Relaxed);
    }
    // SAFETY: an all-zero sigaction is valid to fill in; the handler only
    // calls write(2).
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(signal, &action, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(Error::InvalidArgument(format!(
            "cannot handle signal {signal}: {}",
            std::io::Error::last_os_error()
        )));
    }
    installed.push(signal);
    Ok(())
}

fn watch(read_end: i32) {
    let mut byte = [0u8; 64];
    loop {
        // SAFETY: reading into a valid buffer from the pipe we own.
        let n = unsafe { libc::read(read_end, byte.as_mut_ptr().cast(), byte.len()) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return;
        }
        eprintln!(
            "rccl hang report (pid {}):\n{}",
            std::process::id(),
            crate::hang_report()
        );
    }
}

/// The signal number `RCCL_HANG_REPORT_SIGNAL` names, if any.
fn signal_from_env() -> Option<i32> {
    let text = std::env::var("RCCL_HANG_REPORT_SIGNAL").ok()?;
    let name = text.trim().trim_start_matches("SIG");
    Some(match name {
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "" | "0" => return None,
        other => match other.parse() {
            Ok(n) => n,
            Err(_) => {
                tracing::warn!("RCCL_HANG_REPORT_SIGNAL={text:?} is not a signal; ignored");
                return None;
            }
        },
    })
}

/// Installs the handler `RCCL_HANG_REPORT_SIGNAL` asks for (at init).
pub(crate) fn install_from_env() {
    if let Some(signal) = signal_from_env() {
        if let Err(err) = report_hangs_on_signal(signal) {
            tracing::warn!("RCCL_HANG_REPORT_SIGNAL: {err}");
        }
    }
}
