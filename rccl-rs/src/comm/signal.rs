//! Hang reports on a signal: `kill -USR1 <pid>` prints what every live
//! communicator of the process is doing to standard error.
//!
//! The handler only writes one byte to a pipe (async-signal-safe); a
//! watcher thread blocked on the pipe's other end builds and prints the
//! report. Enabled by [`report_hangs_on_signal`], or at the first
//! communicator's init by `RCCL_HANG_REPORT_SIGNAL` (`USR1`, `SIGUSR2`,
//! `SIGRTMIN+2`, a number).
//!
//! Only signals with no meaning of their own are taken: SIGUSR1, SIGUSR2
//! and the real-time signals SIGRTMIN..=SIGRTMAX. Any other signal already
//! means something (SIGTERM stops the process, SIGSEGV reports a fault,
//! SIGKILL and SIGSTOP cannot be caught), and replacing its action would
//! take that away, so it is refused by name.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

use super::report::hang_report;
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

/// Prints [`hang_report`] to standard error whenever the process
/// receives `signal` (`libc::SIGUSR1`, `libc::SIGUSR2` or a real-time
/// signal), replacing that signal's previous disposition. Any other signal
/// is refused with [`Error::InvalidArgument`] naming it. Idempotent.
pub fn report_hangs_on_signal(signal: i32) -> Result<()> {
    check_signal(signal).map_err(|why| Error::InvalidArgument(format!("hang reports: {why}")))?;
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
            hang_report()
        );
    }
}

/// The standard signals, by their names without `SIG`.
const NAMED: [(libc::c_int, &str); 30] = [
    (libc::SIGHUP, "HUP"),
    (libc::SIGINT, "INT"),
    (libc::SIGQUIT, "QUIT"),
    (libc::SIGILL, "ILL"),
    (libc::SIGTRAP, "TRAP"),
    (libc::SIGABRT, "ABRT"),
    (libc::SIGBUS, "BUS"),
    (libc::SIGFPE, "FPE"),
    (libc::SIGKILL, "KILL"),
    (libc::SIGUSR1, "USR1"),
    (libc::SIGSEGV, "SEGV"),
    (libc::SIGUSR2, "USR2"),
    (libc::SIGPIPE, "PIPE"),
    (libc::SIGALRM, "ALRM"),
    (libc::SIGTERM, "TERM"),
    (libc::SIGCHLD, "CHLD"),
    (libc::SIGCONT, "CONT"),
    (libc::SIGSTOP, "STOP"),
    (libc::SIGTSTP, "TSTP"),
    (libc::SIGTTIN, "TTIN"),
    (libc::SIGTTOU, "TTOU"),
    (libc::SIGURG, "URG"),
    (libc::SIGXCPU, "XCPU"),
    (libc::SIGXFSZ, "XFSZ"),
    (libc::SIGVTALRM, "VTALRM"),
    (libc::SIGPROF, "PROF"),
    (libc::SIGWINCH, "WINCH"),
    (libc::SIGIO, "IO"),
    (libc::SIGPWR, "PWR"),
    (libc::SIGSYS, "SYS"),
];

/// `signal`'s name and number, e.g. `SIGTERM (15)`.
fn describe(signal: i32) -> String {
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    match NAMED.iter().find(|(n, _)| *n == signal) {
        Some((_, name)) => format!("SIG{name} ({signal})"),
        None if (min..=max).contains(&signal) => format!("SIGRTMIN+{} ({signal})", signal - min),
        None => format!("signal {signal}"),
    }
}

/// Whether hang reports may take over `signal`: the reason if not.
fn check_signal(signal: i32) -> std::result::Result<(), String> {
    let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
    if signal == libc::SIGUSR1 || signal == libc::SIGUSR2 || (min..=max).contains(&signal) {
        return Ok(());
    }
    let what = if NAMED.iter().any(|(n, _)| *n == signal) || (1..=max).contains(&signal) {
        format!(
            "{} has a meaning of its own, which the handler would replace",
            describe(signal)
        )
    } else {
        format!("{signal} is not a signal")
    };
    Err(format!(
        "{what}; use SIGUSR1, SIGUSR2 or a real-time signal (SIGRTMIN+n, up to SIGRTMAX = {max})"
    ))
}

/// The signal `text` names: `USR1`, `SIGUSR1`, `SIGRTMIN+2`, `RTMAX-1` or
/// a number; `""` or `0` for none.
fn parse_signal(text: &str) -> std::result::Result<Option<i32>, String> {
    let upper = text.trim().to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    let offset = |rest: &str, sign: char| -> Option<i32> {
        match rest.strip_prefix(sign) {
            Some(n) => n.parse::<i32>().ok(),
            None => rest.is_empty().then_some(0),
        }
    };
    let signal = if let Some(n) = name.strip_prefix("RTMIN").and_then(|r| offset(r, '+')) {
        libc::SIGRTMIN() + n
    } else if let Some(n) = name.strip_prefix("RTMAX").and_then(|r| offset(r, '-')) {
        libc::SIGRTMAX() - n
    } else if let Some((n, _)) = NAMED.iter().find(|(_, known)| *known == name) {
        *n
    } else {
        match name.parse::<i32>() {
            Ok(0) => return Ok(None),
            Ok(n) => n,
            Err(_) if name.is_empty() => return Ok(None),
            Err(_) => return Err(format!("{text:?} names no signal")),
        }
    };
    check_signal(signal)?;
    Ok(Some(signal))
}

/// Installs the handler `RCCL_HANG_REPORT_SIGNAL` asks for (at init). A
/// value that names no signal, or a signal that is not free for hang
/// reports, fails the init: the variable is there to make hangs visible,
/// and silently ignoring it, or taking over SIGTERM, would defeat that.
pub(crate) fn install_from_env() -> Result<()> {
    let Some(text) = rccl_env::var("RCCL_HANG_REPORT_SIGNAL") else {
        return Ok(());
    };
    let signal = parse_signal(&text)
        .map_err(|why| Error::InvalidArgument(format!("RCCL_HANG_REPORT_SIGNAL={text}: {why}")))?;
    match signal {
        Some(signal) => report_hangs_on_signal(signal),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_with_a_meaning_of_their_own_are_refused_by_name() {
        for (text, named) in [
            ("15", "SIGTERM (15)"),
            ("11", "SIGSEGV (11)"),
            ("SIGTERM", "SIGTERM (15)"),
            ("TERM", "SIGTERM (15)"),
            ("sigint", "SIGINT (2)"),
            ("9", "SIGKILL (9)"),
            ("SIGCHLD", "SIGCHLD (17)"),
        ] {
            let why = parse_signal(text).unwrap_err();
            assert!(why.contains(named), "{text}: {why}");
            assert!(why.contains("SIGUSR1"), "{text}: {why}");
        }
        assert!(parse_signal("1000")
            .unwrap_err()
            .contains("1000 is not a signal"));
        assert!(parse_signal("-3")
            .unwrap_err()
            .contains("-3 is not a signal"));
        assert!(parse_signal("USR3")
            .unwrap_err()
            .contains("\"USR3\" names no signal"));
        for signal in [libc::SIGTERM, libc::SIGSEGV, 0, -1] {
            let err = report_hangs_on_signal(signal).unwrap_err();
            assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
        }
    }

    #[test]
    fn user_and_real_time_signals_are_accepted() {
        let (min, max) = (libc::SIGRTMIN(), libc::SIGRTMAX());
        for (text, signal) in [
            ("USR1", Some(libc::SIGUSR1)),
            ("SIGUSR1", Some(libc::SIGUSR1)),
            ("sigusr2", Some(libc::SIGUSR2)),
            ("SIGRTMIN", Some(min)),
            ("RTMIN+2", Some(min + 2)),
            ("SIGRTMAX-1", Some(max - 1)),
            (" 0 ", None),
            ("", None),
        ] {
            assert_eq!(parse_signal(text), Ok(signal), "{text}");
        }
        assert_eq!(
            parse_signal(&libc::SIGUSR1.to_string()),
            Ok(Some(libc::SIGUSR1))
        );
        assert!(parse_signal("RTMAX+1").is_err());
        assert!(parse_signal("SIGRTMIN-1").is_err());
        assert_eq!(describe(min + 3), format!("SIGRTMIN+3 ({})", min + 3));
    }
}
