//! The process's encryption of its TCP connections (NCCL's
//! `ncclSetEncryption`): with a pre-shared key, the bootstrap network and
//! the Socket network encrypt and authenticate every connection made from
//! then on ([`rccl_transports::auth_tcp::seal`]). Shared memory, the board
//! and the IB network stay unencrypted, as in NCCL.

pub use rccl_transports::auth_tcp::MIN_PSK_BYTES;
use rccl_transports::auth_tcp::{self, Psk};

use crate::error::{Error, Result};

/// Encrypts the process's TCP connections with `psk` (at least
/// [`MIN_PSK_BYTES`] bytes), or goes back to plaintext with
/// `None`. Every process of a job must hold the same key, set before it
/// makes its unique ids and communicators: a communicator keeps the
/// setting its connections were made with.
pub fn set_encryption(psk: Option<&[u8]>) -> Result<()> {
    let psk = psk
        .map(Psk::new)
        .transpose()
        .map_err(|e| Error::InvalidArgument(format!("encryption: {e}")))?;
    auth_tcp::set_encryption(psk);
    Ok(())
}

/// Whether the process encrypts its TCP connections.
pub fn encrypted() -> bool {
    auth_tcp::encryption().is_some()
}
