//! What a communicator keeps between launches: its connections per channel
//! and peer, its board, and the last lone all-reduce's plan.

use crate::host_work::executor::{BoardLink, Link, Reduction};
use crate::tuning;
use crate::types::{DataType, RedOp};

/// The executor's state of a communicator: its connections, per channel
/// and peer rank. Locked for the duration of each launch.
pub(crate) struct ExecState {
    /// The connections of calls on host memory.
    pub links: Vec<Vec<Option<Link>>>,
    /// The connections of calls on device memory that the host executor
    /// runs over host copies (`host_staging.rs`), made apart.
    pub device_links: Vec<Vec<Option<Link>>>,
    /// The board, once a call has needed it.
    pub board: Option<BoardLink>,
    /// The last lone all-reduce asked about the board, remembered whole.
    pub lone: Option<LoneBoardCall>,
    /// The FIFOs and state of calls run as device work, once one ran.
    pub device_work: Option<crate::device_links::DeviceLinks>,
}

impl ExecState {
    /// The connections of calls on device memory, or on host memory.
    pub fn links_for(&self, on_device: bool) -> &[Vec<Option<Link>>] {
        if on_device {
            &self.device_links
        } else {
            &self.links
        }
    }

    /// The same, to add to.
    pub fn links_for_mut(&mut self, on_device: bool) -> &mut [Vec<Option<Link>>] {
        if on_device {
            &mut self.device_links
        } else {
            &mut self.links
        }
    }

    /// Every connection, of both kinds of calls.
    pub fn all_links(&self) -> impl Iterator<Item = &Link> + Clone {
        self.links
            .iter()
            .chain(&self.device_links)
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
