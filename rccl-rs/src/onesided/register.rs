//! Registering a window, collectively (`ncclCommWindowRegister` /
//! `ncclCommWindowDeregister`).
//!
//! Registration takes two all-gathers over the bootstrap. In the first
//! every rank publishes its window (address, size, flags, where a process
//! of its host finds the memory, its signal block) or why it cannot; in
//! the second each says whether it could reach every peer's. Any failure
//! fails the registration on every rank with the same message, so a
//! window exists everywhere or nowhere. The first registration also
//! makes the signal blocks.

use std::sync::Arc;
use std::time::Instant;

use rccl_transports::{Export, FileId, PeerWindow, ServedFd, SignalBlock, FD_TOKEN};

use super::device_memory::{device_of, offer, DeviceExport, Imported};
use super::{next_handle, Signals, State, Window, WindowEntry};
use super::{WIN_COLL_SYMMETRIC, WIN_FLAGS, WIN_REQUIRED_ALIGNMENT};
use crate::comm::{CommInner, Communicator};
use crate::error::{Error, Result};
use crate::memory::{Hold, MemUse, Place, Purpose};

const REGISTER: &str = "ncclCommWindowRegister";
const DEREGISTER: &str = "ncclCommWindowDeregister";

/// What a rank publishes of a window it registers.
#[derive(Debug, PartialEq)]
struct Published {
    base: u64,
    size: u64,
    flags: u32,
    /// Where a process of its host maps the window, if it can.
    shared: Option<Shared>,
    /// Where a process of its host maps its signal block.
    signals: Option<FileId>,
    /// Whether the buffer is device memory.
    device: bool,
}

/// How a process of a window's host maps it.
#[derive(Clone, Debug, PartialEq)]
enum Shared {
    /// Shareable host memory: its memory file, opened through the owner.
    Host(Export),
    /// Device memory: its exported descriptor, handed over by the owner.
    Device(DeviceExport),
}

/// What this rank offers peers in other processes of its window.
#[derive(Default)]
struct Offer {
    shared: Option<Shared>,
    /// The server of the device's export of device memory, alive while
    /// the window lives so that peers can take it.
    served: Option<ServedFd>,
}

impl Offer {
    /// The offer of `size` bytes at `base`; device memory is served only
    /// when `peer_processes` (some rank of this host is in another
    /// process), host memory is always counted as in a window.
    fn of(base: *mut u8, size: usize, peer_processes: bool) -> std::result::Result<Offer, String> {
        Ok(match device_of(base) {
            Some(_) if !peer_processes => Offer::default(),
            Some(device) => match offer(device, base, size)? {
                Some((export, served)) => Offer {
                    shared: Some(Shared::Device(export)),
                    served: Some(served),
                },
                None => Offer::default(),
            },
            None => Offer {
                shared: rccl_transports::export_window(base, size).map(Shared::Host),
                served: None,
            },
        })
    }

    /// Whether the export counts as a use of shareable host memory.
    fn of_host(&self) -> bool {
        matches!(self.shared, Some(Shared::Host(_)))
    }
}

impl Communicator {
    /// Registers `size` bytes at `base` as a window of every rank
    /// (`ncclCommWindowRegister`): a collective call, every rank with its
    /// own buffer (sizes may differ unless `flags` has
    /// [`super::WIN_COLL_SYMMETRIC`]). Afterwards every rank on this host
    /// can put into every other's window. `base` must be a multiple of
    /// [`super::WIN_REQUIRED_ALIGNMENT`]; for peers in other processes it
    /// must be memory from `ncclMemAlloc` (shareable), as NCCL asks, host
    /// or device memory.
    ///
    /// # Safety
    /// `[base, base + size)` must stay valid, and be written by peers at
    /// any time, until the window is deregistered.
    pub unsafe fn register_window(&self, base: *mut u8, size: usize, flags: u32) -> Result<Window> {
        self.with_one_sided(|comm, state| register(comm, state, base, size, flags))
    }

    /// Deregisters `window` (`ncclCommWindowDeregister`), collectively:
    /// every rank must deregister the same window, or every rank gets an
    /// error (a rank that is alone in it waits the communicator's timeout).
    pub fn deregister_window(&self, window: Window) -> Result<()> {
        self.with_one_sided(|comm, state| deregister(comm, state, window))
    }
}

fn register(
    comm: &CommInner,
    state: &mut State,
    base: *mut u8,
    size: usize,
    flags: u32,
) -> Result<Window> {
    let me = comm.rank;
    let seq = state.registered;
    let what = format!("window #{seq} of rank {me} ({base:p}, {size} bytes)");
    let mut local =
        local_problem(base, flags).map(|why| Error::InvalidArgument(format!("{what}: {why}")));
    let fresh_signals = state.signals.is_none();
    let mut own_block = None;
    if fresh_signals && local.is_none() {
        let slots = signal_slots(comm);
        let made = hold_block(comm, None)
            .map_err(|e| same_kind(&e, format!("{what}: its signal block: {}", message(&e))))
            .and_then(|held| {
                SignalBlock::create(slots)
                    .map(|block| (Arc::new(block), held))
                    .map_err(|e| {
                        Error::InvalidArgument(format!(
                            "rank {me}: cannot make its signal block: {e}"
                        ))
                    })
            });
        match made {
            Ok(made) => own_block = Some(made),
            Err(e) => local = Some(e),
        }
    }
    let offered = match local {
        None => Offer::of(base, size, peer_processes(comm)).unwrap_or_else(|why| {
            local = Some(Error::System(format!("{what}: {why}")));
            Offer::default()
        }),
        Some(_) => Offer::default(),
    };
    let signals_id = own_block.as_ref().map(|(block, _)| block.id());
    let mine = match &local {
        Some(problem) => encode_problem(problem),
        None => encode(&Published {
            base: base as u64,
            size: size as u64,
            flags,
            shared: offered.shared.clone(),
            signals: signals_id,
            device: device_of(base).is_some(),
        }),
    };
    let release = |offered: &Offer| {
        if offered.of_host() {
            rccl_transports::release_window(base);
        }
    };
    let gathered = match comm.bootstrap.allgather(&mine) {
        Ok(all) => all,
        Err(e) => {
            release(&offered);
            return Err(with_context(REGISTER, &what, e));
        }
    };
    // Every rank reads the same bytes, so every rank fails alike.
    let published = match decode_all(&gathered) {
        Ok(p) => p,
        Err(e) => {
            release(&offered);
            return Err(e);
        }
    };
    let reached = reach(comm, seq, &published, fresh_signals)
        .map_err(|e| same_kind(&e, format!("{REGISTER}: {}", message(&e))));
    let verdict = match &reached {
        Ok(_) => {
            // Peers put once they have every verdict: land from now on.
            let block = own_block.as_ref().map(|(block, _)| block.clone());
            state.landing.open(seq, base, size, block);
            Vec::new()
        }
        Err(e) => encode_problem(e),
    };
    let verdicts = comm
        .bootstrap
        .allgather(&verdict)
        .map_err(|e| with_context(REGISTER, &what, e));
    let failed = verdicts.map(|all| {
        all.iter()
            .find(|v| !v.is_empty())
            .map(|v| decode_problem(v))
    });
    match (failed, reached) {
        (Ok(None), Ok(reached)) => {
            if let Some(mut blocks) = reached.blocks {
                let (own, own_held) = own_block.expect("made at the first registration");
                blocks[me] = Some(own);
                let mut held = reached.blocks_held;
                held.push(own_held);
                state.signals = Some(Signals {
                    blocks,
                    consumed: vec![0; signal_slots(comm)],
                    _held: held,
                });
            }
            state.registered += 1;
            let handle = next_handle();
            state.windows.insert(
                handle,
                WindowEntry {
                    seq,
                    base: base as usize,
                    size,
                    flags,
                    exported: offered.of_host(),
                    device: published.iter().any(|p| p.device),
                    peers: reached.peers,
                    sizes: published.iter().map(|p| p.size as usize).collect(),
                    _held: reached.windows_held,
                    _offered: offered.served,
                    _imports: reached.imports,
                    _device_use: device_of(base)
                        .map(|_| super::DeviceUse::new(base as usize, size)),
                },
            );
            Ok(Window(handle))
        }
        (Ok(Some(e)), _) | (Ok(None), Err(e)) | (Err(e), _) => {
            state.landing.forget(seq);
            release(&offered);
            Err(e)
        }
    }
}

/// Whether some rank of this host runs in another process.
fn peer_processes(comm: &CommInner) -> bool {
    let host = &comm.peers[comm.rank].host_id;
    (0..comm.nranks).any(|r| comm.peers[r].host_id == *host && comm.in_other_process(r))
}

/// Counters in a rank's signal block: one per context, signal index and
/// source rank.
fn signal_slots(comm: &CommInner) -> usize {
    comm.config.rma_contexts * comm.config.rma_signals * comm.nranks
}

/// Enters a signal block (this rank's, or `peer`'s as mapped here) in the
/// ledger; it persists across a suspend, as its counts must.
fn hold_block(comm: &CommInner, peer: Option<usize>) -> Result<Hold> {
    let bytes = SignalBlock::bytes(signal_slots(comm)) as u64;
    let what = MemUse::new(Purpose::Window, Place::Host, bytes).persistent();
    comm.memory.hold(match peer {
        Some(peer) => what.peer(peer),
        None => what,
    })
}

/// Why this rank's buffer cannot be a window, if it cannot.
fn local_problem(base: *mut u8, flags: u32) -> Option<String> {
    if base.is_null() {
        return Some("the buffer is NULL".into());
    }
    if flags & !WIN_FLAGS != 0 {
        return Some(format!("unknown winFlags {flags:#x}"));
    }
    if !(base as usize).is_multiple_of(WIN_REQUIRED_ALIGNMENT) {
        return Some(format!(
            "the buffer is {} bytes past a multiple of NCCL_WIN_REQUIRED_ALIGNMENT \
             ({WIN_REQUIRED_ALIGNMENT} bytes)",
            base as usize % WIN_REQUIRED_ALIGNMENT
        ));
    }
    None
}

/// What a rank reaches of its peers at a registration.
struct Reached {
    /// Per rank, its window (`None` on another host).
    peers: Vec<Option<PeerWindow>>,
    /// The mappings among `peers` in the ledger.
    windows_held: Vec<Hold>,
    /// Peers' device memory mapped into this process, for `peers`.
    imports: Vec<Imported>,
    /// At the first registration, per rank, its signal block (this rank's
    /// own and those on other hosts `None`).
    blocks: Option<Vec<Option<Arc<SignalBlock>>>>,
    /// The mapped blocks among `blocks` in the ledger.
    blocks_held: Vec<Hold>,
}

/// Peers' windows (and, at the first registration, signal blocks) as this
/// rank reaches them, each mapping entered in the ledger, or why it
/// cannot.
fn reach(
    comm: &CommInner,
    seq: u64,
    published: &[Published],
    fresh_signals: bool,
) -> Result<Reached> {
    let usage = |why: String| Error::InvalidUsage(why);
    let first = &published[0];
    for (rank, p) in published.iter().enumerate() {
        if p.flags != first.flags {
            return Err(usage(format!(
                "window #{seq}: rank 0 registers it with winFlags {:#x}, rank {rank} with {:#x}: \
                 every rank must pass the same flags",
                first.flags, p.flags
            )));
        }
        if first.flags & WIN_COLL_SYMMETRIC != 0 && p.size != first.size {
            return Err(usage(format!(
                "window #{seq} is NCCL_WIN_COLL_SYMMETRIC but rank 0 registers {} bytes and rank \
                 {rank} {} bytes: a symmetric window has one size on every rank",
                first.size, p.size
            )));
        }
    }
    let me = comm.rank;
    if let Some(owner) = published.iter().position(|p| p.device) {
        let apart = (0..published.len()).find(|&r| comm.peers[r].host_id != comm.peers[me].host_id);
        if let Some(apart) = apart {
            return Err(usage(format!(
                "window #{seq} of rank {owner} is device memory, which windows reach between \
                 ranks of one host only, and {} is on another host than rank {me}",
                comm.describe(apart)
            )));
        }
    }
    let mut reached = Reached {
        peers: Vec::with_capacity(published.len()),
        windows_held: Vec::new(),
        imports: Vec::new(),
        blocks: fresh_signals.then(Vec::new),
        blocks_held: Vec::new(),
    };
    for (rank, p) in published.iter().enumerate() {
        let same_host = comm.peers[rank].host_id == comm.peers[me].host_id;
        let window = if !same_host {
            None
        } else if !comm.in_other_process(rank) {
            Some(PeerWindow::in_process(p.base as *mut u8, p.size as usize))
        } else {
            let Some(shared) = &p.shared else {
                return Err(usage(format!(
                    "window #{seq} of rank {rank} ({:#x}, {} bytes) is not memory from \
                     ncclMemAlloc, so {} cannot map it from another process",
                    p.base,
                    p.size,
                    comm.describe(me)
                )));
            };
            let (place, file_len) = match shared {
                Shared::Host(export) => (Place::Host, export.file_len),
                Shared::Device(export) => (Place::Device, export.file_len),
            };
            let held = hold_mapping(comm, rank, file_len, place).map_err(|e| {
                same_kind(
                    &e,
                    format!("mapping window #{seq} of rank {rank}: {}", message(&e)),
                )
            })?;
            reached.windows_held.push(held);
            let cannot = |e: String| {
                usage(format!(
                    "rank {me} cannot map window #{seq} of rank {rank} ({} bytes): {e}",
                    p.size
                ))
            };
            let size = p.size as usize;
            match shared {
                Shared::Device(export) => {
                    let deadline = Instant::now() + comm.config.timeout;
                    let imported = Imported::map(export, size, deadline).map_err(cannot)?;
                    let window = PeerWindow::in_process(imported.window(export), size);
                    reached.imports.push(imported);
                    Some(window)
                }
                Shared::Host(export) => {
                    Some(PeerWindow::map(export, size).map_err(|e| cannot(e.to_string()))?)
                }
            }
        };
        reached.peers.push(window);
        if let Some(blocks) = &mut reached.blocks {
            let block = if rank == me || !same_host {
                // This rank's own block joins the table once all agree.
                None
            } else {
                let id = p.signals.as_ref().ok_or_else(|| {
                    usage(format!(
                        "rank {rank} published no signal block at the first registration"
                    ))
                })?;
                let held = hold_block(comm, Some(rank)).map_err(|e| {
                    same_kind(
                        &e,
                        format!("mapping the signal block of rank {rank}: {}", message(&e)),
                    )
                })?;
                reached.blocks_held.push(held);
                Some(
                    SignalBlock::open(id, signal_slots(comm))
                        .map(Arc::new)
                        .map_err(|e| {
                            usage(format!(
                                "rank {me} cannot map the signal block of rank {rank}: {e}"
                            ))
                        })?,
                )
            };
            blocks.push(block);
        }
    }
    Ok(reached)
}

/// Enters this rank's mapping of `peer`'s window (its whole memory file
/// or device allocation of `bytes`) in the ledger; it persists across a
/// suspend, as the window does.
fn hold_mapping(comm: &CommInner, peer: usize, bytes: usize, place: Place) -> Result<Hold> {
    comm.memory.hold(
        MemUse::new(Purpose::Window, place, bytes as u64)
            .peer(peer)
            .persistent(),
    )
}

fn deregister(comm: &CommInner, state: &mut State, window: Window) -> Result<()> {
    let entry = state.window(comm, window, DEREGISTER)?;
    let seq = entry.seq;
    let what = format!(
        "window #{seq} of rank {} ({:#x}, {} bytes)",
        comm.rank, entry.base, entry.size
    );
    let all = comm
        .bootstrap
        .allgather(&seq.to_le_bytes())
        .map_err(|e| with_context(DEREGISTER, &what, e))?;
    for (rank, bytes) in all.iter().enumerate() {
        let theirs = bytes
            .as_slice()
            .try_into()
            .map(u64::from_le_bytes)
            .map_err(|_| {
                Error::Remote(format!(
                    "{DEREGISTER}: rank {rank} sent {} bytes",
                    bytes.len()
                ))
            })?;
        if theirs != seq {
            return Err(Error::InvalidUsage(format!(
                "{DEREGISTER}: rank {} deregisters window #{seq}, rank {rank} window #{theirs}: \
                 every rank must deregister the same window",
                comm.rank
            )));
        }
    }
    // Puts from other hosts sent before their deregistration land first.
    state.landing.close(comm, seq)?;
    let entry = state.windows.remove(&window.0).expect("found above");
    if entry.exported {
        rccl_transports::release_window(entry.base as *const u8);
    }
    Ok(())
}

/// `err` of a bootstrap exchange, said as a failure of `call` on `what`.
fn with_context(call: &str, what: &str, err: Error) -> Error {
    let text = format!(
        "{call} of {what}: {err} (every rank of the communicator must make this call, in the \
         same order)"
    );
    same_kind(&err, text)
}

/// An error of `err`'s kind saying `text`.
fn same_kind(err: &Error, text: String) -> Error {
    match err {
        Error::System(_) => Error::System(text),
        Error::Remote(_) => Error::Remote(text),
        Error::InvalidArgument(_) => Error::InvalidArgument(text),
        Error::Internal(_) => Error::Internal(text),
        Error::InvalidUsage(_) => Error::InvalidUsage(text),
    }
}

/// What `err` says, without its kind.
fn message(err: &Error) -> &str {
    match err {
        Error::System(m)
        | Error::Remote(m)
        | Error::InvalidArgument(m)
        | Error::Internal(m)
        | Error::InvalidUsage(m) => m,
    }
}

const OK: u8 = 0;
/// A rank's problem follows, its kind in the next byte ([`KINDS`]).
const PROBLEM: u8 = 1;
/// The kinds of error a rank's problem may have, by their byte.
const KINDS: [fn(String) -> Error; 5] = [
    Error::InvalidArgument,
    Error::InvalidUsage,
    Error::System,
    Error::Remote,
    Error::Internal,
];

/// `err` as every rank reads it back with [`decode_problem`].
fn encode_problem(err: &Error) -> Vec<u8> {
    let kind = match err {
        Error::InvalidArgument(_) => 0,
        Error::InvalidUsage(_) => 1,
        Error::System(_) => 2,
        Error::Remote(_) => 3,
        Error::Internal(_) => 4,
    };
    let mut out = vec![PROBLEM, kind];
    out.extend_from_slice(message(err).as_bytes());
    out
}

/// The error [`encode_problem`] wrote (`bytes` begins with [`PROBLEM`]).
fn decode_problem(bytes: &[u8]) -> Error {
    let kind = bytes.get(1).and_then(|&k| KINDS.get(usize::from(k)));
    let text = String::from_utf8_lossy(bytes.get(2..).unwrap_or_default()).into_owned();
    kind.map_or(
        Error::Remote(format!("a rank sent a bad problem: {text}")),
        |make| make(text),
    )
}

/// How [`encode`] says a window's [`Shared`].
const NOT_SHARED: u64 = 0;
const SHARED_HOST: u64 = 1;
/// A [`DeviceExport`]: its token and name follow the words.
const SHARED_DEVICE: u64 = 2;

fn encode(p: &Published) -> Vec<u8> {
    let file = |id: &FileId| [u64::from(id.pid), id.fd as u64];
    let mut words = vec![p.base, p.size, u64::from(p.flags)];
    let mut tail = Vec::new();
    match &p.shared {
        Some(Shared::Host(e)) => words.extend([
            SHARED_HOST,
            file(&e.file)[0],
            file(&e.file)[1],
            e.file_len as u64,
            e.offset as u64,
        ]),
        Some(Shared::Device(e)) => {
            words.extend([SHARED_DEVICE, 0, 0, e.file_len as u64, e.offset as u64]);
            tail.extend_from_slice(&e.token);
            tail.extend_from_slice(e.name.as_bytes());
        }
        None => words.extend([NOT_SHARED, 0, 0, 0, 0]),
    }
    match &p.signals {
        Some(id) => words.extend([1, file(id)[0], file(id)[1]]),
        None => words.extend([0; 3]),
    }
    words.push(u64::from(p.device));
    let mut out = vec![OK];
    for word in words {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(&tail);
    out
}

/// Every rank's window, or the first rank's problem as the error.
fn decode_all(all: &[Vec<u8>]) -> Result<Vec<Published>> {
    if let Some(problem) = all.iter().find(|b| b.first() == Some(&PROBLEM)) {
        let err = decode_problem(problem);
        return Err(same_kind(&err, format!("{REGISTER}: {}", message(&err))));
    }
    all.iter()
        .enumerate()
        .map(|(rank, bytes)| {
            decode(bytes).ok_or_else(|| {
                Error::Remote(format!(
                    "{REGISTER}: rank {rank} published {} bad bytes",
                    bytes.len()
                ))
            })
        })
        .collect()
}

fn decode(bytes: &[u8]) -> Option<Published> {
    let rest = bytes.strip_prefix(&[OK])?;
    let (rest, tail) = rest.split_at_checked(12 * 8)?;
    let w: Vec<u64> = rest
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let file = |pid: u64, fd: u64| -> Option<FileId> {
        Some(FileId {
            pid: u32::try_from(pid).ok()?,
            fd: i32::try_from(fd).ok()?,
        })
    };
    let (file_len, offset) = (usize::try_from(w[6]).ok()?, usize::try_from(w[7]).ok()?);
    let shared = match w[3] {
        NOT_SHARED if tail.is_empty() => None,
        SHARED_HOST if tail.is_empty() => Some(Shared::Host(Export {
            file: file(w[4], w[5])?,
            file_len,
            offset,
        })),
        SHARED_DEVICE => {
            let (token, name) = tail.split_at_checked(FD_TOKEN)?;
            Some(Shared::Device(DeviceExport {
                name: String::from_utf8(name.to_vec())
                    .ok()
                    .filter(|n| !n.is_empty())?,
                token: token.try_into().ok()?,
                file_len,
                offset,
            }))
        }
        _ => return None,
    };
    let signals = match w[8] {
        0 => None,
        _ => Some(file(w[9], w[10])?),
    };
    Some(Published {
        base: w[0],
        size: w[1],
        flags: u32::try_from(w[2]).ok()?,
        shared,
        signals,
        device: w[11] != 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_window_reads_back_whole() {
        let p = Published {
            base: 0x7f00_0000_1000,
            size: 12345,
            flags: 3,
            shared: Some(Shared::Host(Export {
                file: FileId { pid: 42, fd: 7 },
                file_len: 16384,
                offset: 4096,
            })),
            signals: Some(FileId { pid: 42, fd: 8 }),
            device: false,
        };
        assert_eq!(decode(&encode(&p)), Some(p));
        let p = Published {
            base: 0x7f00_0000_1000,
            size: 4096,
            flags: 0,
            shared: Some(Shared::Device(DeviceExport {
                name: "rccl-ipc-42-0011".into(),
                token: [7; FD_TOKEN],
                file_len: 2 << 20,
                offset: 8192,
            })),
            signals: None,
            device: true,
        };
        let bytes = encode(&p);
        assert_eq!(decode(&bytes), Some(p));
        // A device export without its whole token reads as nothing.
        assert!(decode(&bytes[..12 * 8 + 1 + FD_TOKEN - 1]).is_none());
        let bytes = encode(&Published {
            base: 1,
            size: 2,
            flags: 0,
            shared: None,
            signals: None,
            device: false,
        });
        assert!(decode(&bytes).unwrap().shared.is_none());
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
    }
}
