//! What a communicator keeps between launches: its connections per channel
//! and peer, its board, and the last lone all-reduce's plan.

use crate::device_executor::links::DeviceLinks;
use crate::host_executor::executor::{BoardLink, Link, Reduction};
use crate::tuning;
use crate::types::{DataType, Executor, RedOp};

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
    /// The FIFOs and state of calls run as device work, once one ran.
    pub device_links: Option<DeviceLinks>,
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
