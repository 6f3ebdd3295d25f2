//! Splitting a communicator (`ncclCommSplit`): every rank tells its color
//! and key, each color's first member (by key, then rank) makes the new
//! unique id and sends it to the others, and they join it.

use std::sync::atomic::Ordering;

use super::Communicator;
use crate::bootstrap::UniqueId;
use crate::config::Config;
use crate::error::{Error, Result};

/// The first bootstrap tag of a split's unique id; each split of a
/// communicator takes the next.
const SPLIT_TAG_BASE: u64 = 1 << 40;

impl Communicator {
    /// Splits the communicator (`ncclCommSplit`): ranks passing the same
    /// `color` form a new communicator, ordered by `key` then by rank;
    /// ranks passing `None` (NCCL's `NCCL_SPLIT_NOCOLOR`) take part but get
    /// no communicator. Every rank must call it.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        self.split_config(color, key, self.inner.config.clone())
    }

    /// As [`Communicator::split`], the new communicator with settings
    /// `config` (`ncclCommSplit`'s config).
    pub fn split_config(
        &self,
        color: Option<u32>,
        key: i32,
        config: Config,
    ) -> Result<Option<Communicator>> {
        let inner = &self.inner;
        inner.check_usable()?;
        let split = inner.splits.fetch_add(1, Ordering::Relaxed);
        let mut mine = Vec::with_capacity(9);
        mine.push(u8::from(color.is_some()));
        mine.extend_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine.extend_from_slice(&key.to_le_bytes());
        let all = inner.bootstrap.allgather(&mine)?;
        let mut members = Vec::new();
        for (rank, bytes) in all.iter().enumerate() {
            if bytes.len() != 9 {
                return Err(Error::Remote(format!(
                    "rank {rank} sent a malformed split request"
                )));
            }
            let their_color =
                (bytes[0] == 1).then(|| u32::from_le_bytes(bytes[1..5].try_into().unwrap()));
            let their_key = i32::from_le_bytes(bytes[5..9].try_into().unwrap());
            if their_color.is_some() && their_color == color {
                members.push((their_key, rank));
            }
        }
        let Some(_) = color else {
            return Ok(None);
        };
        members.sort_unstable();
        let new_rank = members
            .iter()
            .position(|&(_, r)| r == inner.rank)
            .ok_or_else(|| Error::Internal("split lost this rank".into()))?;
        let tag = SPLIT_TAG_BASE + split;
        let leader = members[0].1;
        let id = if leader == inner.rank {
            let id = UniqueId::new()?;
            for &(_, member) in &members[1..] {
                inner.bootstrap.send(member, tag, &id.0)?;
            }
            id
        } else {
            let bytes = inner.bootstrap.recv(leader, tag)?;
            UniqueId(bytes.try_into().map_err(|_| {
                Error::Remote(format!(
                    "rank {leader} sent a malformed unique id for split"
                ))
            })?)
        };
        Communicator::init_rank_config(members.len(), &id, new_rank, config).map(Some)
    }
}
