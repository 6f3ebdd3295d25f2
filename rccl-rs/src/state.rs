//! What a communicator keeps between launches: its connections per channel
//! and peer, its board, and the last lone all-reduce's plan.

use crate::executor::{BoardLink, Link, Reduction};
use crate::tuning;
use crate::types::{DataType, RedOp};

/// The executor's state of a communicator: its connections, per channel
/// and peer rank. Locked for the duration of each launch.
pub(crate) struct ExecState {
    pub links: Vec<Vec<Option<Link>>>,
    /// The board, once a call has needed it.
    pub board: Option<BoardLink>,
    /// The last lone all-reduce asked about the board, remembered whole.
    pub lone: Option<LoneBoardCall>,
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
