//! Communicators: unique ids, creation (init, split, shrink, grow),
//! queries and teardown.

use std::cell::RefCell;
use std::ffi::{c_int, CStr};
use std::sync::Arc;
use std::thread::JoinHandle;

use rccl::{CollCall, CollKind, Communicator, Config, DataType, Error, RedOp, Result, UniqueId};

use crate::abi::*;
use crate::check::{invalid, non_null, usage, write_out};
use crate::error::{guard, Outcome};
use crate::registry::{self, Entry, Slot};

/// Communicator settings read from an `ncclConfig_t`.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub blocking: bool,
    pub min_channels: Option<usize>,
    pub max_channels: Option<usize>,
    pub name: Option<String>,
    /// `netName`: the network to use, as `NCCL_NET` names it.
    pub net: Option<String>,
    /// `numRmaCtx` and `numRmaSig`: one-sided contexts and signal indices.
    pub rma_contexts: Option<usize>,
    pub rma_signals: Option<usize>,
}

/// A count of `config->{what}` that must be at least 1 when set.
fn at_least_one(value: c_int, what: &str) -> Result<Option<usize>> {
    if value == NCCL_CONFIG_UNDEF_INT {
        return Ok(None);
    }
    match usize::try_from(value) {
        Ok(n) if n >= 1 => Ok(Some(n)),
        _ => Err(invalid(format!("config->{what} = {value} is below 1"))),
    }
}

fn channels(value: c_int, what: &str) -> Result<Option<usize>> {
    if value == NCCL_CONFIG_UNDEF_INT {
        return Ok(None);
    }
    let max = rccl::MAX_CHANNELS;
    match usize::try_from(value) {
        Ok(n) if (1..=max).contains(&n) => Ok(Some(n)),
        _ => Err(invalid(format!(
            "config->{what} = {value} is outside 1..={max}"
        ))),
    }
}

/// Reads `config` (NULL: defaults). Configurations from older headers are
/// shorter: fields past their `size` keep the defaults.
pub unsafe fn read_config(config: *const ncclConfig_t) -> Result<Settings> {
    let mut settings = Settings {
        blocking: true,
        ..Settings::default()
    };
    if config.is_null() {
        return Ok(settings);
    }
    let mut c = ncclConfig_t::initializer();
    // SAFETY: the caller passes an initialized ncclConfig_t; `size` and
    // `magic` lead every version of it, and only `size` bytes are read.
    unsafe {
        let (size, magic) = ((*config).size, (*config).magic);
        if magic != NCCL_API_MAGIC {
            return Err(invalid(format!(
                "config->magic is {magic:#x}, not NCCL_API_MAGIC: initialize the config with NCCL_CONFIG_INITIALIZER"
            )));
        }
        if size < std::mem::offset_of!(ncclConfig_t, cgaClusterSize) {
            return Err(invalid(format!("config->size {size} is too small")));
        }
        let n = size.min(std::mem::size_of::<ncclConfig_t>());
        std::ptr::copy_nonoverlapping(
            config.cast::<u8>(),
            (&mut c as *mut ncclConfig_t).cast::<u8>(),
            n,
        );
    }
    settings.blocking = match c.blocking {
        NCCL_CONFIG_UNDEF_INT | 1 => true,
        0 => false,
        other => return Err(invalid(format!("config->blocking = {other} is not 0 or 1"))),
    };
    settings.min_channels = channels(c.minCTAs, "minCTAs")?;
    settings.max_channels = channels(c.maxCTAs, "maxCTAs")?;
    if let (Some(min), Some(max)) = (settings.min_channels, settings.max_channels) {
        if min > max {
            return Err(invalid(format!(
                "config->minCTAs = {min} is above config->maxCTAs = {max}"
            )));
        }
    }
    settings.rma_contexts = at_least_one(c.numRmaCtx, "numRmaCtx")?;
    settings.rma_signals = at_least_one(c.numRmaSig, "numRmaSig")?;
    if !c.commName.is_null() {
        // SAFETY: a non-NULL commName is a C string, per nccl.h.
        settings.name = Some(
            unsafe { CStr::from_ptr(c.commName) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    if !c.netName.is_null() {
        // SAFETY: a non-NULL netName is a C string, per nccl.h.
        settings.net = Some(
            unsafe { CStr::from_ptr(c.netName) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    Ok(settings)
}

impl Settings {
    /// The engine settings: `base` with the channel range and the network
    /// overridden.
    pub fn engine_config(&self, mut base: Config) -> Config {
        if let Some(net) = &self.net {
            base.net = Some(net.clone());
        }
        if let Some(max) = self.max_channels {
            base.max_channels = max;
            base.min_channels = base.min_channels.min(max);
        }
        if let Some(min) = self.min_channels {
            base.min_channels = min;
            base.max_channels = base.max_channels.max(min);
        }
        base.rma_contexts = self.rma_contexts.unwrap_or(base.rma_contexts);
        base.rma_signals = self.rma_signals.unwrap_or(base.rma_signals);
        base
    }
}

/// A creation (or another collective setup call) still running when its
/// group ends, or a call that runs only then.
enum Waiter {
    Entry(Arc<Entry>),
    Anonymous(JoinHandle<Result<()>>),
    AtEnd(Box<dyn FnOnce() -> Result<()> + Send>),
}

thread_local! {
    /// Creations started inside this thread's open group.
    static GROUP_CREATIONS: RefCell<Vec<Waiter>> = const { RefCell::new(Vec::new()) };
}

/// Waits for the creations of the group that just ended on this thread:
/// blocking ones to completion; non-blocking ones make the result
/// `ncclInProgress` while they run.
pub fn finish_group_creations() -> Outcome {
    let queued = GROUP_CREATIONS.with(|g| std::mem::take(&mut *g.borrow_mut()));
    // Calls deferred to the end start now, together: one thread may have
    // queued a collective call for several ranks.
    let waiters = queued
        .into_iter()
        .map(|waiter| match waiter {
            Waiter::AtEnd(work) => spawn(work).map(Waiter::Anonymous),
            other => Ok(other),
        })
        .collect::<Result<Vec<_>>>()?;
    let mut code = ncclSuccess;
    let mut first_err = None;
    for waiter in waiters {
        let result = match waiter {
            Waiter::Entry(entry) if !entry.blocking => {
                if entry.in_progress() {
                    code = ncclInProgress;
                    continue;
                }
                entry.comm().map(drop)
            }
            Waiter::Entry(entry) => entry.comm().map(drop),
            Waiter::Anonymous(handle) => handle
                .join()
                .unwrap_or_else(|_| Err(Error::Internal("a group's setup thread panicked".into()))),
            Waiter::AtEnd(_) => unreachable!("started above"),
        };
        if let Err(err) = result {
            first_err.get_or_insert(err);
        }
    }
    match first_err {
        Some(err) => Err(err),
        None => Ok(code),
    }
}

/// Runs `work` now or, inside a group, at the group's end on a thread of
/// its own, beside the other calls deferred to it: collective calls
/// (window registration) that one thread makes for several ranks of a
/// process, and waits for signals, which must not start before the
/// group's puts (a wait started at once would hold the one-sided state
/// the puts need, and two ranks waiting so would wait for each other).
pub fn now_or_at_group_end(work: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    if rccl::group_depth() == 0 {
        return work();
    }
    GROUP_CREATIONS.with(|g| g.borrow_mut().push(Waiter::AtEnd(Box::new(work))));
    Ok(())
}

fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<JoinHandle<Result<T>>> {
    std::thread::Builder::new()
        .name("rcclrs-init".into())
        .spawn(work)
        .map_err(|e| Error::io("starting a communicator creation thread", e))
}

/// Creates a communicator into `*out`: now, or (inside a group, or when
/// non-blocking) on a thread of its own, the handle being usable at once.
unsafe fn create(
    out: *mut ncclComm_t,
    settings: &Settings,
    device: c_int,
    work: impl FnOnce() -> Result<Communicator> + Send + 'static,
) -> Outcome {
    let in_group = rccl::group_depth() > 0;
    if in_group || !settings.blocking {
        let entry = Entry::new(
            Slot::Pending(spawn(work)?),
            settings.blocking,
            device,
            settings.name.clone(),
        );
        registry::insert(entry.clone());
        // SAFETY: `out` was checked non-NULL by the caller.
        unsafe { *out = entry.handle() };
        let code = if settings.blocking {
            ncclSuccess
        } else {
            ncclInProgress
        };
        if in_group {
            GROUP_CREATIONS.with(|g| g.borrow_mut().push(Waiter::Entry(entry)));
        }
        return Ok(code);
    }
    // SAFETY: as above.
    unsafe { *out = std::ptr::null_mut() };
    let comm = work()?;
    let entry = Entry::new(Slot::Ready(comm), true, device, settings.name.clone());
    registry::insert(entry.clone());
    // SAFETY: as above.
    unsafe { *out = entry.handle() };
    Ok(ncclSuccess)
}

fn rank_args(nranks: c_int, rank: c_int) -> Result<(usize, usize)> {
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| invalid(format!("nranks {nranks} must be at least 1")))?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| invalid(format!("rank {rank} is out of range for {nranks} ranks")))?;
    Ok((n, r))
}

fn unique_id(id: &ncclUniqueId) -> UniqueId {
    UniqueId(id.internal.map(|c| c as u8))
}

fn to_c_id(id: &UniqueId) -> ncclUniqueId {
    ncclUniqueId {
        internal: id.0.map(|b| b as std::ffi::c_char),
    }
}

unsafe fn init_rank(
    out: *mut ncclComm_t,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *const ncclConfig_t,
) -> Outcome {
    non_null(out, "comm")?;
    // SAFETY: the caller vouches for `config` (NULL or an initialized
    // ncclConfig_t) as init_rank's caller's caller does.
    let settings = unsafe { read_config(config)? };
    let (n, r) = rank_args(nranks, rank)?;
    let engine = settings.engine_config(Config::from_env()?);
    // SAFETY: `out` is non-NULL (checked above) and, by the caller's
    // word, writable.
    unsafe {
        create(out, &settings, 0, move || {
            Communicator::init_rank_config(n, &id, r, engine)
        })
    }
}

/// The communicator behind a handle, waiting for a pending creation.
pub fn comm_of(comm: ncclComm_t) -> Result<(Arc<Entry>, Communicator)> {
    let entry = registry::lookup(comm)?;
    let c = entry.comm()?;
    Ok((entry, c))
}

nccl_api! {
    /// Creates a unique id whose root this process serves.
    fn ncclGetUniqueId / pncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t {
        guard("ncclGetUniqueId", std::ptr::null_mut(), || {
            non_null(uniqueId, "uniqueId")?;
            let id = UniqueId::new()?;
            // SAFETY: the caller vouches that a non-NULL `uniqueId` is
            // writable (crate docs, "Pointers from C").
            unsafe { write_out(uniqueId, to_c_id(&id), "uniqueId")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int
    ) -> ncclResult_t {
        // SAFETY: the caller vouches for `comm` as an out-argument.
        guard("ncclCommInitRank", std::ptr::null_mut(), || unsafe {
            init_rank(comm, nranks, unique_id(&commId), rank, std::ptr::null())
        })
    }

    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches for `comm` as an out-argument and for
        // `config` as NULL or an initialized ncclConfig_t.
        guard("ncclCommInitRankConfig", std::ptr::null_mut(), || unsafe {
            init_rank(comm, nranks, unique_id(&commId), rank, config)
        })
    }

    /// Uses the first of the ids (every rank passes the same list).
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut ncclComm_t, nranks: c_int, myrank: c_int, nId: c_int,
        commIds: *mut ncclUniqueId, config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches for `newcomm` as an out-argument,
        // `commIds` (checked non-NULL) as `nId` initialized ids, and
        // `config` as NULL or an initialized ncclConfig_t.
        guard("ncclCommInitRankScalable", std::ptr::null_mut(), || unsafe {
            non_null(commIds, "commIds")?;
            if nId < 1 || nId > nranks {
                return Err(invalid(format!("nId {nId} is outside 1..=nranks ({nranks})")));
            }
            init_rank(newcomm, nranks, unique_id(&*commIds), myrank, config)
        })
    }

    /// `ndev` communicators of this process; `devlist` (may be NULL) only
    /// sets what `ncclCommCuDevice` reports.
    fn ncclCommInitAll / pncclCommInitAll(
        comms: *mut ncclComm_t, ndev: c_int, devlist: *const c_int
    ) -> ncclResult_t {
        guard("ncclCommInitAll", std::ptr::null_mut(), || {
            non_null(comms, "comms")?;
            let n = usize::try_from(ndev)
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| invalid(format!("ndev {ndev} must be at least 1")))?;
            let devices: Vec<c_int> = if devlist.is_null() {
                (0..ndev).collect()
            } else {
                // SAFETY: the caller vouches that a non-NULL `devlist`
                // holds `ndev` ints.
                unsafe { std::slice::from_raw_parts(devlist, n) }.to_vec()
            };
            let all = Communicator::init_all_config(n, Config::from_env()?)?;
            for (i, c) in all.into_iter().enumerate() {
                let entry = Entry::new(Slot::Ready(c), true, devices[i], None);
                registry::insert(entry.clone());
                // SAFETY: the caller vouches that `comms` (checked
                // non-NULL) has room for `ndev` handles, and i < ndev.
                unsafe { *comms.add(i) = entry.handle() };
            }
            Ok(ncclSuccess)
        })
    }

    /// Ranks passing the same color form a communicator, ordered by key;
    /// `NCCL_SPLIT_NOCOLOR` ranks get NULL. The channel range is the
    /// parent's; `config` (NULL: the parent's) sets blocking and the name.
    fn ncclCommSplit / pncclCommSplit(
        comm: ncclComm_t, color: c_int, key: c_int, newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches for `newcomm` as an out-argument and
        // `config` as NULL or an initialized ncclConfig_t.
        guard("ncclCommSplit", comm, || unsafe {
            non_null(newcomm, "newcomm")?;
            let (entry, parent) = comm_of(comm)?;
            let mut settings = read_config(config)?;
            if config.is_null() {
                settings.blocking = entry.blocking;
            }
            let color = match color {
                NCCL_SPLIT_NOCOLOR => None,
                c if c >= 0 => Some(c as u32),
                c => return Err(invalid(format!("color {c} is negative and not NCCL_SPLIT_NOCOLOR"))),
            };
            let Some(color) = color else {
                *newcomm = std::ptr::null_mut();
                if rccl::group_depth() > 0 {
                    let handle = spawn(move || parent.split(None, key).map(drop))?;
                    GROUP_CREATIONS.with(|g| g.borrow_mut().push(Waiter::Anonymous(handle)));
                } else {
                    parent.split(None, key)?;
                }
                return Ok(ncclSuccess);
            };
            create(newcomm, &settings, entry.device, move || {
                parent.split(Some(color), key)?.ok_or_else(|| {
                    Error::Internal("split with a color returned no communicator".into())
                })
            })
        })
    }

    /// The ranks not in `excludeRanksList` form a new communicator, in
    /// their order. Excluded ranks do not call it; the survivors share the
    /// new communicator's id over the parent's connections, so the parent
    /// must still work between them.
    fn ncclCommShrink / pncclCommShrink(
        comm: ncclComm_t, excludeRanksList: *mut c_int, excludeRanksCount: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t, shrinkFlags: c_int,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches for `newcomm` as an out-argument,
        // `excludeRanksList` as `excludeRanksCount` ints, and `config` as
        // NULL or an initialized ncclConfig_t.
        guard("ncclCommShrink", comm, || unsafe {
            non_null(newcomm, "newcomm")?;
            let (entry, parent) = comm_of(comm)?;
            if shrinkFlags & !NCCL_SHRINK_ABORT != 0 {
                return Err(invalid(format!("unknown shrinkFlags {shrinkFlags:#x}")));
            }
            let n = parent.count();
            let count = usize::try_from(excludeRanksCount)
                .map_err(|_| invalid(format!("excludeRanksCount {excludeRanksCount} is negative")))?;
            if count > 0 {
                non_null(excludeRanksList, "excludeRanksList")?;
            }
            let mut excluded = vec![false; n];
            for i in 0..count {
                let r = *excludeRanksList.add(i);
                match usize::try_from(r).ok().filter(|&r| r < n) {
                    Some(r) => excluded[r] = true,
                    None => return Err(invalid(format!("excluded rank {r} is out of range for {n} ranks"))),
                }
            }
            if excluded[parent.rank()] {
                return Err(invalid(format!(
                    "rank {} is in excludeRanksList: excluded ranks do not call ncclCommShrink",
                    parent.rank()
                )));
            }
            let survivors: Vec<usize> = (0..n).filter(|&r| !excluded[r]).collect();
            let mut settings = read_config(config)?;
            if config.is_null() {
                settings.blocking = entry.blocking;
            }
            let engine = settings.engine_config(parent.config().clone());
            create(newcomm, &settings, entry.device, move || shrink(&parent, &survivors, engine))
        })
    }

    /// A unique id for [`ncclCommGrow`], served by this process.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(
        comm: ncclComm_t, uniqueId: *mut ncclUniqueId
    ) -> ncclResult_t {
        guard("ncclCommGetUniqueId", comm, || {
            non_null(uniqueId, "uniqueId")?;
            comm_of(comm)?;
            let id = UniqueId::new()?;
            // SAFETY: the caller vouches that a non-NULL `uniqueId` is
            // writable (crate docs, "Pointers from C").
            unsafe { write_out(uniqueId, to_c_id(&id), "uniqueId")? };
            Ok(ncclSuccess)
        })
    }

    /// Existing ranks keep their rank in the larger communicator; the one
    /// holding the id shares it with the others over the parent.
    fn ncclCommGrow / pncclCommGrow(
        comm: ncclComm_t, nRanks: c_int, uniqueId: *const ncclUniqueId, rank: c_int,
        newcomm: *mut ncclComm_t, config: *mut ncclConfig_t,
    ) -> ncclResult_t {
        // SAFETY: the caller vouches for `newcomm` as an out-argument,
        // `uniqueId` as NULL or an initialized id, and `config` as NULL or
        // an initialized ncclConfig_t.
        guard("ncclCommGrow", comm, || unsafe {
            non_null(newcomm, "newcomm")?;
            let settings = read_config(config)?;
            if comm.is_null() {
                // A new rank.
                non_null(uniqueId, "uniqueId (a new rank needs the grow id)")?;
                let (n, r) = rank_args(nRanks, rank)?;
                let id = unique_id(&*uniqueId);
                let engine = settings.engine_config(Config::from_env()?);
                return create(newcomm, &settings, 0, move || Communicator::init_rank_config(n, &id, r, engine));
            }
            let (entry, parent) = comm_of(comm)?;
            if rank != -1 {
                return Err(invalid(format!("rank must be -1 for an existing rank, not {rank}")));
            }
            let (n, _) = rank_args(nRanks, parent.rank() as c_int)?;
            if n < parent.count() {
                return Err(invalid(format!("nRanks {nRanks} is below the current {} ranks", parent.count())));
            }
            let mine = (!uniqueId.is_null()).then(|| unique_id(&*uniqueId));
            let engine = settings.engine_config(parent.config().clone());
            create(newcomm, &settings, entry.device, move || grow(&parent, n, mine, engine))
        })
    }

    fn ncclCommFinalize / pncclCommFinalize(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommFinalize", comm, || {
            let (_, c) = comm_of(comm)?;
            c.finalize()?;
            Ok(ncclSuccess)
        })
    }

    /// Frees the handle (NULL: nothing to do); a pending creation is
    /// waited for first. As a finalize then a destroy: work queued on
    /// streams completes first, and its failure is returned (the handle
    /// is freed all the same); an operation another thread still runs on
    /// the communicator is aborted.
    fn ncclCommDestroy / pncclCommDestroy(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommDestroy", comm, || {
            if comm.is_null() {
                return Ok(ncclSuccess);
            }
            let entry = registry::remove(comm)?;
            let _ = entry.comm();
            if let Some(comm) = entry.detach() {
                comm.destroy()?;
            }
            Ok(ncclSuccess)
        })
    }

    /// Stops the communicator's operations (from any thread) and frees the
    /// handle.
    fn ncclCommAbort / pncclCommAbort(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommAbort", comm, || {
            if comm.is_null() {
                return Ok(ncclSuccess);
            }
            let entry = registry::remove(comm)?;
            if !entry.in_progress() {
                if let Ok(c) = entry.comm() {
                    c.abort();
                }
            }
            entry.detach();
            Ok(ncclSuccess)
        })
    }

    fn ncclCommRevoke / pncclCommRevoke(comm: ncclComm_t, revokeFlags: c_int) -> ncclResult_t {
        guard("ncclCommRevoke", comm, || {
            comm_of(comm)?;
            if revokeFlags != 0 {
                return Err(invalid(format!("revokeFlags must be NCCL_REVOKE_DEFAULT (0), not {revokeFlags}")));
            }
            Err(usage(
                "not supported: rccl-rs cannot stop in-flight operations and keep the \
                 communicator usable for split or shrink; use ncclCommAbort",
            ))
        })
    }

    /// `ncclInProgress` while a non-blocking creation runs, then the
    /// creation's failure or the communicator's first failure.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(
        comm: ncclComm_t, asyncError: *mut ncclResult_t
    ) -> ncclResult_t {
        guard("ncclCommGetAsyncError", comm, || {
            non_null(asyncError, "asyncError")?;
            let entry = registry::lookup(comm)?;
            let code = if entry.in_progress() {
                ncclInProgress
            } else {
                match entry.comm() {
                    Ok(c) => match c.async_error() {
                        // ncclGetLastError then says what went wrong.
                        Some(e) => {
                            crate::error::record(comm, &format!("asynchronous error: {e}"));
                            e.code()
                        }
                        None => ncclSuccess,
                    },
                    Err(e) => e.code(),
                }
            };
            // SAFETY: the caller vouches for `asyncError` as an out-argument.
            unsafe { write_out(asyncError, code, "asyncError")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclCommCount / pncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t {
        guard("ncclCommCount", comm, || {
            non_null(count, "count")?;
            let (_, c) = comm_of(comm)?;
            // SAFETY: the caller vouches for `count` as an out-argument.
            unsafe { write_out(count, c.count() as c_int, "count")? };
            Ok(ncclSuccess)
        })
    }

    /// The device index the communicator was created for: `devlist[i]` (or
    /// i) for ncclCommInitAll, 0 otherwise. No device is used.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t {
        guard("ncclCommCuDevice", comm, || {
            non_null(device, "device")?;
            let entry = registry::lookup(comm)?;
            // SAFETY: the caller vouches for `device` as an out-argument.
            unsafe { write_out(device, entry.device, "device")? };
            Ok(ncclSuccess)
        })
    }

    fn ncclCommUserRank / pncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t {
        guard("ncclCommUserRank", comm, || {
            non_null(rank, "rank")?;
            let (_, c) = comm_of(comm)?;
            // SAFETY: the caller vouches for `rank` as an out-argument.
            unsafe { write_out(rank, c.rank() as c_int, "rank")? };
            Ok(ncclSuccess)
        })
    }

    /// Collective: gives back every allocation a suspend may release
    /// (`NCCL_SUSPEND_MEM`, the one flag); calls fail until the resume.
    fn ncclCommSuspend / pncclCommSuspend(comm: ncclComm_t, flags: c_int) -> ncclResult_t {
        guard("ncclCommSuspend", comm, || {
            let (_, c) = comm_of(comm)?;
            if flags & !NCCL_SUSPEND_MEM != 0 {
                return Err(invalid(format!("unknown suspend flags {flags:#x}")));
            }
            if flags & NCCL_SUSPEND_MEM != 0 {
                c.suspend()?;
            }
            Ok(ncclSuccess)
        })
    }

    /// Collective: the next calls connect again.
    fn ncclCommResume / pncclCommResume(comm: ncclComm_t) -> ncclResult_t {
        guard("ncclCommResume", comm, || {
            let (_, c) = comm_of(comm)?;
            c.resume()?;
            Ok(ncclSuccess)
        })
    }

    /// The communicator's ledger: bytes held (host allocations too, for a
    /// communicator on host memory), and whether it is suspended (0 or 1).
    fn ncclCommMemStats / pncclCommMemStats(
        comm: ncclComm_t, stat: ncclCommMemStat_t, value: *mut u64
    ) -> ncclResult_t {
        guard("ncclCommMemStats", comm, || {
            non_null(value, "value")?;
            let (_, c) = comm_of(comm)?;
            let stats = c.mem_stats();
            let figure = match stat {
                0 => stats.suspendable,
                1 => u64::from(stats.suspended),
                2 => stats.persistent,
                3 => stats.total,
                _ => return Err(invalid(format!("unknown ncclCommMemStat_t {stat}"))),
            };
            // SAFETY: the caller vouches for `value` as an out-argument.
            unsafe { write_out(value, figure, "value")? };
            Ok(ncclSuccess)
        })
    }
}

/// `ncclCommSuspend`'s flag: release the communicator's memory.
const NCCL_SUSPEND_MEM: c_int = 0x01;

/// The survivors' new communicator: the first survivor makes its id and
/// sends it to the others.
fn shrink(parent: &Communicator, survivors: &[usize], config: Config) -> Result<Communicator> {
    let me = parent.rank();
    let new_rank = survivors.iter().position(|&r| r == me).expect("a survivor");
    let leader = survivors[0];
    let mut id = UniqueId([0; 128]);
    if me == leader {
        id = UniqueId::new()?;
        rccl::group_start();
        for &peer in &survivors[1..] {
            // SAFETY: `id` lives until group_end returns.
            let _ = unsafe { parent.send_raw(id.0.as_ptr(), 128, DataType::Uint8, peer) };
        }
        rccl::group_end()?;
    } else {
        // SAFETY: `id` is 128 writable bytes for the call's duration.
        unsafe { parent.recv_raw(id.0.as_mut_ptr(), 128, DataType::Uint8, leader)? };
    }
    Communicator::init_rank_config(survivors.len(), &id, new_rank, config)
}

/// An existing rank's part of a grow: learn the id from whichever rank
/// holds it, then join with the same rank.
fn grow(
    parent: &Communicator,
    nranks: usize,
    mine: Option<UniqueId>,
    config: Config,
) -> Result<Communicator> {
    let n = parent.count();
    let mut send = [0u8; 129];
    if let Some(id) = mine {
        send[0] = 1;
        send[1..].copy_from_slice(&id.0);
    }
    let mut all = vec![0u8; 129 * n];
    let call = CollCall {
        kind: CollKind::AllGather,
        count: 129,
        dtype: DataType::Uint8,
        op: RedOp::Sum,
        root: 0,
    };
    // SAFETY: both buffers are sized for the all-gather and live until it
    // returns (no group is open on this thread).
    unsafe { parent.collective_raw(call, send.as_ptr(), all.as_mut_ptr())? };
    let holders: Vec<&[u8]> = all.chunks(129).filter(|c| c[0] == 1).collect();
    let [holder] = holders[..] else {
        return Err(usage(format!(
            "ncclCommGrow: {} existing ranks passed a unique id; exactly one must",
            holders.len()
        )));
    };
    let id = UniqueId(holder[1..].try_into().expect("128 bytes"));
    Communicator::init_rank_config(nranks, &id, parent.rank(), config)
}
