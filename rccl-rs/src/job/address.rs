//! The rendezvous address of a communicator joined through the
//! environment: `NCCL_COMM_ID`, or torchrun's `MASTER_ADDR` and
//! `MASTER_PORT`.

use crate::error::{Error, Result};

/// The address rank 0 serves the rendezvous at: `NCCL_COMM_ID=host:port`
/// when set, else `MASTER_ADDR` and the port [`rendezvous_port`] takes
/// for `MASTER_PORT` (an IPv6 host in brackets).
pub(crate) fn rendezvous_address() -> Result<String> {
    if let Some(addr) = rccl_env::var("NCCL_COMM_ID") {
        return Ok(addr);
    }
    let host = env_required("MASTER_ADDR")?;
    let port = rendezvous_port(&env_required("MASTER_PORT")?)?;
    Ok(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// The rendezvous port for `MASTER_PORT`: torchrun's agent keeps its own
/// store on that port when it sets `TORCHELASTIC_USE_AGENT_STORE=True`, so
/// the rendezvous takes the next one.
fn rendezvous_port(master_port: &str) -> Result<u16> {
    let port: u16 = master_port.trim().parse().map_err(|_| {
        Error::InvalidArgument(format!("MASTER_PORT={master_port} is not a port number"))
    })?;
    let agent_store = std::env::var("TORCHELASTIC_USE_AGENT_STORE")
        .is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    if !agent_store {
        return Ok(port);
    }
    port.checked_add(1).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "MASTER_PORT={port} is torchrun's store, and no port follows it for the rendezvous; \
             choose a lower --master-port or set NCCL_COMM_ID"
        ))
    })
}

fn env_required(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::InvalidArgument(format!("{name} is not set")))
}
