//! Whether a process of this host still runs: the cheap check behind the
//! shared-memory transport's detection of a dead peer.
//!
//! A process is named by its pid and its start time (field 22 of
//! `/proc/<pid>/stat`, in clock ticks since boot), so a pid reused by an
//! unrelated process after the peer died is not mistaken for the peer.

/// The effective uid of this process: the user whose files and sockets
/// it may trust.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A process: pid and start time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessId {
    /// Its pid (in this pid namespace).
    pub pid: u32,
    /// Its start time in clock ticks since boot.
    pub start: u64,
}

/// The state letter and start time of `pid`, from `/proc/<pid>/stat`;
/// `Err` with the kind of the failure to read it.
fn stat(pid: u32) -> std::io::Result<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidData))
}

/// Parses the state (field 3) and start time (field 22) of a stat line;
/// the command name (field 2) may hold spaces and parentheses.
pub fn parse_stat(text: &str) -> Option<(char, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?.chars().next()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

impl ProcessId {
    /// This process.
    pub fn current() -> Option<ProcessId> {
        let pid = std::process::id();
        stat(pid).ok().map(|(_, start)| ProcessId { pid, start })
    }

    /// Whether this process is visible from here (same pid namespace):
    /// `/proc/<pid>` exists with the same start time.
    pub fn visible(&self) -> bool {
        matches!(stat(self.pid), Ok((_, start)) if start == self.start)
    }

    /// Why the process is known to be gone, or `None` while it runs (or
    /// when it cannot be told).
    pub fn gone(&self) -> Option<String> {
        match stat(self.pid) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Some(format!("process {} no longer exists", self.pid))
            }
            Err(_) => None,
            Ok((_, start)) if start != self.start => Some(format!(
                "process {} no longer exists (its pid now names another process)",
                self.pid
            )),
            Ok(('Z' | 'X' | 'x', _)) => Some(format!("process {} has exited", self.pid)),
            Ok(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_names_with_spaces_and_parens() {
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 12345 1000 10";
        assert_eq!(parse_stat(line), Some(('S', 12345)));
        assert_eq!(parse_stat("garbage"), None);
        assert_eq!(parse_stat("1 (x) S 1"), None);
    }

    #[test]
    fn this_process_runs_and_a_child_that_exited_is_gone() {
        let me = ProcessId::current().unwrap();
        assert!(me.visible());
        assert_eq!(me.gone(), None);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let them = ProcessId {
            pid: child.id(),
            start: stat(child.id()).map(|s| s.1).unwrap_or(0),
        };
        // Exited but not reaped: a zombie is gone too.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(them.gone().is_some());
        child.wait().unwrap();
        assert!(them.gone().is_some());
        let reused = ProcessId {
            start: me.start + 1,
            ..me
        };
        assert!(reused.gone().unwrap().contains("another process"));
    }
}
