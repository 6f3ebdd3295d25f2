//! What a communicator keeps between launches: its connections per channel
//! and peer, its board, and the last lone all-reduce's plan.

use std::any::Any;

use rccl_transports::{Board, Connection, ProcessId};

use crate::kernels::Reduction;
use crate::memory::Hold;
use crate::tuning;
use crate::types::{DataType, Executor, RedOp};

/// A connection to one peer on one channel, with what logs call it.
pub struct Link {
    /// The connection's FIFOs.
    pub conn: Box<dyn Connection>,
    /// "rank 3 (10.0.0.2)" style name of the peer.
    pub peer_name: String,
    /// Its bytes in the communicator's ledger.
    pub _held: Hold,
}

/// A communicator's board with what a wait on it needs.
pub struct BoardLink {
    /// The board.
    pub board: Board,
    /// The process of each rank, where its death can be seen from here.
    pub watch: Vec<Option<ProcessId>>,
    /// What logs call each rank.
    pub names: Vec<String>,
    /// Its bytes in the communicator's ledger.
    pub _held: Hold,
}

/// The executor's state of a communicator: its connections, per channel
/// and peer rank. Locked for the duration of each launch.
pub(crate) struct ExecState {
    /// The connections of calls on host memory.
    pub host_links: Vec<Vec<Option<Link>>>,
    /// The connections of calls on device memory that the host executor
    /// runs over host copies (`device_executor/host_staging.rs`), made
    /// apart.
    pub staged_links: Vec<Vec<Option<Link>>>,
    /// The board, once a call has needed it.
    pub board: Option<BoardLink>,
    /// The last lone all-reduce asked about the board, remembered whole.
    pub lone: Option<LoneBoardCall>,
    /// The FIFOs and state of calls run as device work, once one ran
    /// (the device executor's own type: `device_executor/links.rs`).
    pub device_links: Option<Box<dyn KeptLinks>>,
}

/// State an executor keeps on a communicator between launches besides the
/// host links above. The communicator only closes its connections when it
/// goes; the executor that made it reads it back as its own type.
pub(crate) trait KeptLinks: Any + Send {
    /// Its connections to peers, closed when the communicator goes.
    fn connections(&self) -> Vec<&dyn Connection>;
}

impl ExecState {
    /// The host executor's connections of launches run by `executor`
    /// (device work has none here: it keeps [`ExecState::device_links`]).
    pub fn links_for(&self, executor: Executor) -> &[Vec<Option<Link>>] {
        match executor {
            Executor::Host => &self.host_links,
            Executor::HostOverStaging => &self.staged_links,
            Executor::Device => &[],
        }
    }

    /// The same, to add to.
    pub fn links_for_mut(&mut self, executor: Executor) -> &mut [Vec<Option<Link>>] {
        match executor {
            Executor::Host => &mut self.host_links,
            Executor::HostOverStaging => &mut self.staged_links,
            Executor::Device => &mut [],
        }
    }

    /// Every connection, of both kinds of calls.
    pub fn all_links(&self) -> impl Iterator<Item = &Link> + Clone {
        self.host_links
            .iter()
            .chain(&self.staged_links)
            .flatten()
            .flatten()
    }
}

/// The last lone all-reduce that asked whether it runs on the board, with
/// the answer and, when it does, what its run needs: a training loop
/// repeats the same call, and asking the tuner, building the reduction and
/// packing the call's tag cost more than the exchange of a small one.
pub(crate) struct LoneBoardCall {
    /// The tuner generation the answer was given under.
    pub generation: u64,
    pub count: usize,
    pub dtype: DataType,
    pub op: RedOp,
    pub in_place: bool,
    pub choice: tuning::Choice,
    /// The call's reduction when it runs on the board; `None` when the
    /// tuner sends it elsewhere.
    pub reduction: Option<Reduction>,
    /// The call word of its tag (all but the sequence number and count).
    pub call: u32,
}
