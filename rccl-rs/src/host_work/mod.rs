//! Running host-memory work: the executor that walks each channel's
//! schedule against its connections, the tag every piece carries, and the
//! waits that tell apart calls that differ between ranks.

pub(crate) mod call;
pub(crate) mod executor;
pub(crate) mod stuck;
