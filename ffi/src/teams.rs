//! The host side of NCCL's device API that needs no device code
//! (`nccl_device/host.h`): the communicator's properties and its teams.
//!
//! A team is `{nRanks, rank, stride}`: world ranks `base + i * stride`
//! for `i < nRanks`, this rank being `i = rank`. The world team holds
//! every rank; the LSA team (load/store accessible) the ranks of this
//! host; the rail team the ranks with this rank's local index on every
//! host. A team needs evenly strided ranks, so the LSA team spans a host
//! only when every host holds the same number of consecutive ranks;
//! otherwise each rank is its own LSA team (and the rail team is the
//! world).

use std::ffi::c_int;

use rccl::Communicator;

use crate::abi::*;
use crate::check::{invalid, non_null, usage};
use crate::comms::comm_of;
use crate::error::guard;

/// `ncclTeam_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ncclTeam_t {
    pub nRanks: c_int,
    pub rank: c_int,
    pub stride: c_int,
}

/// `ncclGinType_t`'s value for "no GPU-initiated networking".
pub const NCCL_GIN_TYPE_NONE: c_int = 0;
/// `ncclGinConnectionType_t`'s `NCCL_GIN_CONNECTION_NONE`.
pub const NCCL_GIN_CONNECTION_NONE: c_int = 0;
/// The length of `ncclCommProperties_t.ginSupport`.
pub const GIN_SUPPORT_LEN: usize = 64;

/// `ncclCommProperties_t` (nccl_device/host.h).
#[repr(C)]
pub struct ncclCommProperties_t {
    pub size: usize,
    pub magic: u32,
    pub version: u32,
    pub rank: c_int,
    pub nRanks: c_int,
    pub cudaDev: c_int,
    pub nvmlDev: c_int,
    pub deviceApiSupport: bool,
    pub multimemSupport: bool,
    pub ginType: c_int,
    pub nLsaTeams: c_int,
    pub hostRmaSupport: bool,
    pub railedGinType: c_int,
    pub commHash: u64,
    pub ginMinStride: c_int,
    pub ginConnectionType: c_int,
    pub ginSupport: [bool; GIN_SUPPORT_LEN],
    pub devCommRuntimeVersionSize: usize,
    pub cftSupport: bool,
    pub cftMulticastSupport: bool,
    pub cftCountedSupport: bool,
}

/// The size of this rank's LSA team: the ranks per host when every host
/// holds the same number of consecutive ranks, else 1.
fn lsa_size(comm: &Communicator) -> usize {
    let hosts = comm.hosts();
    let per_host = hosts[0].len();
    let regular = hosts.iter().all(|ranks| {
        ranks.len() == per_host && ranks.windows(2).all(|pair| pair[1] == pair[0] + 1)
    });
    if regular {
        per_host
    } else {
        1
    }
}

fn team(n_ranks: usize, rank: usize, stride: usize) -> ncclTeam_t {
    ncclTeam_t {
        nRanks: n_ranks as c_int,
        rank: rank as c_int,
        stride: stride as c_int,
    }
}

fn world_team(comm: &Communicator) -> ncclTeam_t {
    team(comm.count(), comm.rank(), 1)
}

fn lsa_team(comm: &Communicator) -> ncclTeam_t {
    let size = lsa_size(comm);
    team(size, comm.rank() % size, 1)
}

fn rail_team(comm: &Communicator) -> ncclTeam_t {
    let size = lsa_size(comm);
    team(comm.count() / size, comm.rank() / size, size)
}

/// The world rank of member `rank` of `team`, a team of `comm`.
fn team_rank_to_world(comm: &Communicator, t: ncclTeam_t, rank: c_int) -> rccl::Result<usize> {
    if t.nRanks <= 0 || !(0..t.nRanks).contains(&t.rank) || t.stride <= 0 {
        return Err(invalid(format!(
            "team {{nRanks {}, rank {}, stride {}}} is not a team of rank {} of {}",
            t.nRanks,
            t.rank,
            t.stride,
            comm.rank(),
            comm.count()
        )));
    }
    if !(0..t.nRanks).contains(&rank) {
        return Err(invalid(format!(
            "rank {rank} is outside the team's {} ranks",
            t.nRanks
        )));
    }
    let world = comm.rank() as i64 + (rank as i64 - t.rank as i64) * t.stride as i64;
    usize::try_from(world)
        .ok()
        .filter(|&w| w < comm.count())
        .ok_or_else(|| {
            invalid(format!(
                "team {{nRanks {}, rank {}, stride {}}} reaches world rank {world} \
                 outside rank {}'s communicator of {} ranks",
                t.nRanks,
                t.rank,
                t.stride,
                comm.rank(),
                comm.count()
            ))
        })
}

/// Runs a team query that returns a value rather than a result code:
/// on failure, records the message for `ncclGetLastError` and returns
/// `failed`.
fn query<T>(name: &str, comm: ncclComm_t, failed: T, body: impl FnOnce() -> rccl::Result<T>) -> T {
    let mut value = None;
    guard(name, comm, || {
        value = Some(body()?);
        Ok(ncclSuccess)
    });
    value.unwrap_or(failed)
}

fn no_cft() -> rccl::Error {
    usage(
        "not supported: rccl-rs has no CFT (collective fabric) hardware support \
         (ncclCommQueryProperties reports cftSupport = false)",
    )
}

/// The empty team the CFT queries return, as they have no members here.
const NO_TEAM: ncclTeam_t = ncclTeam_t {
    nRanks: 0,
    rank: 0,
    stride: 0,
};

nccl_api! {
    /// Fills `props` (initialized with `NCCL_COMM_PROPERTIES_INITIALIZER`;
    /// a smaller `size` from an older header gets the fields it has). No
    /// device API, multimem, GIN or CFT support is reported.
    fn ncclCommQueryProperties / pncclCommQueryProperties(
        comm: ncclComm_t, props: *mut ncclCommProperties_t,
    ) -> ncclResult_t {
        guard("ncclCommQueryProperties", comm, || {
            non_null(props, "props")?;
            let (entry, c) = comm_of(comm)?;
            // SAFETY: the caller passes a properties struct whose leading
            // size/magic/version it has initialized; only those are read.
            let (size, magic) = unsafe { ((*props).size, (*props).magic) };
            if magic != NCCL_API_MAGIC {
                return Err(invalid(format!(
                    "props->magic is {magic:#x}, not {NCCL_API_MAGIC:#x}: initialize it \
                     with NCCL_COMM_PROPERTIES_INITIALIZER"
                )));
            }
            let header = std::mem::offset_of!(ncclCommProperties_t, rank);
            if size < header {
                return Err(invalid(format!(
                    "props->size is {size}, smaller than its {header}-byte header"
                )));
            }
            let filled = ncclCommProperties_t {
                size,
                magic,
                version: NCCL_VERSION_CODE as u32,
                rank: c.rank() as c_int,
                nRanks: c.count() as c_int,
                cudaDev: entry.device,
                nvmlDev: entry.device,
                deviceApiSupport: false,
                multimemSupport: false,
                ginType: NCCL_GIN_TYPE_NONE,
                nLsaTeams: (c.count() / lsa_size(&c)) as c_int,
                hostRmaSupport: true,
                railedGinType: NCCL_GIN_TYPE_NONE,
                commHash: c.hash(),
                ginMinStride: 0,
                ginConnectionType: NCCL_GIN_CONNECTION_NONE,
                ginSupport: [false; GIN_SUPPORT_LEN],
                devCommRuntimeVersionSize: 0,
                cftSupport: false,
                cftMulticastSupport: false,
                cftCountedSupport: false,
            };
            let end = size.min(std::mem::size_of::<ncclCommProperties_t>());
            // SAFETY: `props` holds at least `size` bytes (the caller's
            // contract); bytes from the end of the header up to `end` are
            // copied from a live struct of the same layout, so the caller's
            // own header stays as it was.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (&filled as *const ncclCommProperties_t as *const u8).add(header),
                    (props as *mut u8).add(header),
                    end - header,
                );
            }
            Ok(ncclSuccess)
        })
    }

    /// Every rank, stride 1. An empty team for an invalid communicator.
    fn ncclTeamWorld / pncclTeamWorld(comm: ncclComm_t) -> ncclTeam_t {
        query("ncclTeamWorld", comm, NO_TEAM, || Ok(world_team(&comm_of(comm)?.1)))
    }

    /// The ranks of this host (see the module's note on layouts).
    fn ncclTeamLsa / pncclTeamLsa(comm: ncclComm_t) -> ncclTeam_t {
        query("ncclTeamLsa", comm, NO_TEAM, || Ok(lsa_team(&comm_of(comm)?.1)))
    }

    /// The ranks with this rank's local index, one per LSA team.
    fn ncclTeamRail / pncclTeamRail(comm: ncclComm_t) -> ncclTeam_t {
        query("ncclTeamRail", comm, NO_TEAM, || Ok(rail_team(&comm_of(comm)?.1)))
    }

    /// No CFT: an empty team, and `ncclGetLastError` says why.
    fn ncclTeamCft / pncclTeamCft(comm: ncclComm_t, _mode: c_int) -> ncclTeam_t {
        query("ncclTeamCft", comm, NO_TEAM, || {
            comm_of(comm)?;
            Err(no_cft())
        })
    }

    /// No CFT multicast: an empty team, and `ncclGetLastError` says why.
    fn ncclTeamCftMultimem / pncclTeamCftMultimem(comm: ncclComm_t) -> ncclTeam_t {
        query("ncclTeamCftMultimem", comm, NO_TEAM, || {
            comm_of(comm)?;
            Err(no_cft())
        })
    }

    /// The world rank of member `rank` of `team`; -1 (with the reason in
    /// `ncclGetLastError`) when the team is not one of this rank's or
    /// `rank` is outside it.
    fn ncclTeamRankToWorld / pncclTeamRankToWorld(
        comm: ncclComm_t, team: ncclTeam_t, rank: c_int,
    ) -> c_int {
        query("ncclTeamRankToWorld", comm, -1, || {
            let (_, c) = comm_of(comm)?;
            Ok(team_rank_to_world(&c, team, rank)? as c_int)
        })
    }

    /// The LSA-team rank of member `rank` of `team`; -1 (with the reason
    /// in `ncclGetLastError`) when that rank is not on this rank's LSA
    /// team.
    fn ncclTeamRankToLsa / pncclTeamRankToLsa(
        comm: ncclComm_t, team: ncclTeam_t, rank: c_int,
    ) -> c_int {
        query("ncclTeamRankToLsa", comm, -1, || {
            let (_, c) = comm_of(comm)?;
            let world = team_rank_to_world(&c, team, rank)?;
            let lsa = lsa_team(&c);
            let first = c.rank() - lsa.rank as usize;
            if !(first..first + lsa.nRanks as usize).contains(&world) {
                return Err(invalid(format!(
                    "member {rank} of the team is world rank {world}, not on rank {}'s \
                     LSA team (world ranks {first}..{})",
                    c.rank(),
                    first + lsa.nRanks as usize
                )));
            }
            Ok((world - first) as c_int)
        })
    }
}
