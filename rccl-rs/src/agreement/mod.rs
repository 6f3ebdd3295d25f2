//! How ranks tell whether they run the same calls, for both executors and
//! the connection setup: the tag every piece carries (`call.rs`), and the
//! word waiting ranks trade so that calls that differ between ranks, and
//! failed peers, are told apart from slow ones (`stuck.rs`).

pub(crate) mod call;
pub(crate) mod stuck;
