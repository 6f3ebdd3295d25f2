//! The unique id: the root's address, the communicator's secret and how
//! it was made.

use super::*;

/// NCCL's `ncclUniqueId`: 128 opaque bytes naming a root (its address and
/// the communicator's secret).
///
/// Layout: `RCID` magic, version, address family (4/6), port (LE), 16
/// address bytes, IPv6 scope id (LE), 32-byte secret, flags (derived from
/// an address; job not named by its launcher), zero padding.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId(pub [u8; 128]);

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.root_addr() {
            Ok(a) => write!(f, "UniqueId(root {a})"),
            Err(_) => f.write_str("UniqueId(<invalid>)"),
        }
    }
}

impl UniqueId {
    /// Like `ncclGetUniqueId`: binds a root listener on this host's
    /// bootstrap address (`NCCL_SOCKET_IFNAME`, `NCCL_SOCKET_FAMILY`) and returns the id naming it,
    /// with a fresh random secret. One thread per process serves every
    /// root until its communicator's ranks have all registered (or the
    /// registered ranks' timeout passes). A root nobody registers at is
    /// released after `RCCL_BOOTSTRAP_ROOT_TIMEOUT` seconds (default 300),
    /// or sooner when the process holds more than 64 such roots (the
    /// oldest first).
    pub fn new() -> Result<UniqueId> {
        UniqueId::new_on(host_address()?)
    }

    /// [`UniqueId::new`] with the root bound on the local address `ip`.
    pub fn new_on(ip: IpAddr) -> Result<UniqueId> {
        let secret = Secret::random();
        let mut listener = AuthListener::bind(SocketAddr::new(ip, 0), secret)
            .map_err(|e| Error::io("bootstrap: binding the root listener", e))?;
        listener.set_handshake_timeout(HANDSHAKE_TIMEOUT);
        let id = UniqueId::encode(listener.local_addr(), &secret, 0);
        spawn_root(Root::new(listener, false))?;
        Ok(id)
    }

    /// For `NCCL_COMM_ID=host:port` (or torchrun's `MASTER_ADDR:MASTER_PORT`):
    /// every rank derives the same id from the address. Rank 0 must also
    /// call [`UniqueId::serve_root`] to start the root there.
    ///
    /// The secret mixes the address with `NCCL_COMM_SECRET` if set, else
    /// with the user's key file (`RCCL_KEY_FILE`, default `~/.rccl/key`,
    /// created on first use), and with the launcher's job name
    /// (`TORCHELASTIC_RUN_ID`, `PMIX_NAMESPACE`, `OMPI_MCA_ess_base_jobid`,
    /// `SLURM_JOB_ID` and `SLURM_STEP_ID`), so neither a stranger who can
    /// reach the address nor another job on it can join. Without a key
    /// file no address is accepted, unless `RCCL_INSECURE_ADDRESS_SECRET=1`.
    pub fn from_address(addr: &str) -> Result<UniqueId> {
        let bad = |why: String| {
            Error::InvalidArgument(format!("'{addr}' is not a usable host:port: {why}"))
        };
        let resolved: SocketAddr = match addr.trim().parse::<SocketAddr>() {
            Ok(a) => a,
            Err(_) => {
                let all: Vec<SocketAddr> = addr
                    .trim()
                    .to_socket_addrs()
                    .map_err(|e| bad(e.to_string()))?
                    .collect();
                all.iter()
                    .find(|a| a.is_ipv4())
                    .or_else(|| all.first())
                    .copied()
                    .ok_or_else(|| bad("it resolves to no address".into()))?
            }
        };
        if resolved.port() == 0 {
            return Err(bad("port 0".into()));
        }
        let derived = crate::job::key::address_secret(resolved)?;
        tracing::info!(
            target: crate::debug::INIT,
            "bootstrap: the communicator at {resolved} belongs to job {}",
            derived.job.as_deref().unwrap_or("<unnamed by the launcher>")
        );
        let flags = FLAG_FROM_ADDRESS
            | if derived.job.is_none() {
                FLAG_UNNAMED_JOB
            } else {
                0
            };
        Ok(UniqueId::encode(resolved, &derived.secret, flags))
    }

    /// Binds the id's exact root address and starts the root rendezvous
    /// there (rank 0's job with [`UniqueId::from_address`]).
    pub fn serve_root(&self) -> Result<()> {
        let addr = self.root_addr()?;
        let mut listener = AuthListener::bind(addr, self.secret()?).map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::AddrInUse {
                " (another job or program is using this address: give each job its own NCCL_COMM_ID or MASTER_PORT)"
            } else {
                ""
            };
            Error::io(
                format!("bootstrap: binding the root listener on {addr}{hint}"),
                e,
            )
        })?;
        listener.set_handshake_timeout(HANDSHAKE_TIMEOUT);
        spawn_root(Root::new(listener, self.flags() & FLAG_UNNAMED_JOB != 0))
    }

    pub(super) fn encode(addr: SocketAddr, secret: &Secret, flags: u8) -> UniqueId {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(&UID_MAGIC);
        b.push(UID_VERSION);
        encode_addr(&addr, &mut b);
        b.extend_from_slice(&secret.0);
        b.push(flags);
        b.resize(128, 0);
        UniqueId(b.try_into().unwrap())
    }

    pub(super) fn flags(&self) -> u8 {
        self.0[FLAGS_AT]
    }

    fn invalid(why: impl fmt::Display) -> Error {
        Error::InvalidArgument(format!("unique id is not valid: {why}"))
    }

    fn check(&self) -> Result<()> {
        if self.0[..4] != UID_MAGIC {
            return Err(UniqueId::invalid("bad magic (not created by rccl-rs?)"));
        }
        if self.0[4] != UID_VERSION {
            return Err(UniqueId::invalid(format_args!(
                "version {}, expected {UID_VERSION}",
                self.0[4]
            )));
        }
        Ok(())
    }

    /// The root's address.
    pub fn root_addr(&self) -> Result<SocketAddr> {
        self.check()?;
        let addr = decode_addr(&self.0[5..5 + ADDR_LEN]).map_err(UniqueId::invalid)?;
        if addr.port() == 0 {
            return Err(UniqueId::invalid("port 0"));
        }
        Ok(addr)
    }

    /// The communicator's secret.
    pub fn secret(&self) -> Result<Secret> {
        self.check()?;
        let at = 5 + ADDR_LEN;
        Ok(Secret(self.0[at..at + 32].try_into().unwrap()))
    }
}
