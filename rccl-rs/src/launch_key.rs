//! The secret of a communicator joined through an address
//! (`NCCL_COMM_ID=host:port`, or torchrun's `MASTER_ADDR:MASTER_PORT`).
//!
//! Every rank derives it alone, from what all ranks of one job share and a
//! stranger who can reach the address lacks:
//!
//! - `NCCL_COMM_SECRET` (or `RCCL_COMM_SECRET`) when set; otherwise
//! - the user's key file, `RCCL_KEY_FILE` or `~/.rccl/key`: created on first
//!   use (32 random bytes, mode 0600, atomically, so ranks that start
//!   together on a shared home directory agree on one) and refused when
//!   others may read or write it. Ranks on hosts that share the home
//!   directory (torchrun, Slurm, mpirun clusters usually do) need no step.
//! - and the job's name where the launcher gives one
//!   (`TORCHELASTIC_RUN_ID`, `PMIX_NAMESPACE`, `OMPI_MCA_ess_base_jobid`,
//!   `SLURM_JOB_ID` and `SLURM_STEP_ID`), so that two jobs of one user on
//!   one address cannot join each other's communicator.
//!
//! With no key file to be had (no home directory, a read-only one) a
//! loopback address still works, with a warning (only this host can reach
//! it); any other address is refused unless
//! `RCCL_INSECURE_ADDRESS_SECRET=1` accepts that anyone who can reach it
//! can join.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rccl_transports::socket::{fill_random, Secret};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// Variables naming the job, innermost launcher first (a torchrun or MPI
/// job under Slurm is named by torchrun or MPI, whose name every rank
/// shares even when Slurm started them in different steps).
const JOB_VARIABLES: [&str; 4] = [
    "TORCHELASTIC_RUN_ID",
    "PMIX_NAMESPACE",
    "OMPI_MCA_ess_base_jobid",
    "SLURM_JOB_ID",
];
/// A key file longer than this is not a key file.
const MAX_KEY_BYTES: u64 = 4096;
/// A key file shorter than this (after trimming whitespace) is refused.
const MIN_KEY_BYTES: usize = 16;

/// An address's secret, and the job name that went into it.
pub(crate) struct AddressSecret {
    pub secret: Secret,
    /// `VARIABLE=value`, when the launcher named the job.
    pub job: Option<String>,
}

/// The launcher's name for this job, as `VARIABLE=value`.
/// `TORCHELASTIC_RUN_ID=none` (torchrun without `--rdzv-id`) names none.
pub(crate) fn job_name() -> Option<String> {
    job_name_from(|name| std::env::var(name).ok())
}

fn job_name_from(lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
    let var = |name: &str| {
        lookup(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let name = JOB_VARIABLES.iter().find_map(|&n| var(n).map(|v| (n, v)))?;
    match name {
        ("TORCHELASTIC_RUN_ID", v) if v == "none" => None,
        ("SLURM_JOB_ID", job) => Some(match var("SLURM_STEP_ID") {
            Some(step) => format!("SLURM_JOB_ID={job} SLURM_STEP_ID={step}"),
            None => format!("SLURM_JOB_ID={job}"),
        }),
        (n, v) => Some(format!("{n}={v}")),
    }
}

/// The key file: `RCCL_KEY_FILE`, else `~/.rccl/key`.
pub(crate) fn key_file_path() -> Option<PathBuf> {
    if let Some(p) = rccl_env::var("RCCL_KEY_FILE").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME").filter(|h| !h.is_empty())?;
    Some(Path::new(&home).join(".rccl").join("key"))
}

/// Why no key came from the key file.
#[derive(Debug)]
pub(crate) enum KeyError {
    /// There is none and none could be made (no home, read-only, ...).
    Unavailable(String),
    /// There is one, but others may read or replace it.
    Unsafe(String),
}

/// The key in `path`, created if there is none.
pub(crate) fn load_or_create_key(path: &Path) -> std::result::Result<Vec<u8>, KeyError> {
    let unavailable =
        |what: &str, e: io::Error| KeyError::Unavailable(format!("{what} {}: {e}", path.display()));
    for _ in 0..2 {
        match File::open(path) {
            Ok(file) => return read_key(path, file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_key(path).map_err(|e| unavailable("cannot create the key file", e))?
            }
            Err(e) => return Err(unavailable("cannot open the key file", e)),
        }
    }
    Err(KeyError::Unavailable(format!(
        "the key file {} vanished while it was being created",
        path.display()
    )))
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn read_key(path: &Path, mut file: File) -> std::result::Result<Vec<u8>, KeyError> {
    let meta = file.metadata().map_err(|e| {
        KeyError::Unavailable(format!(
            "cannot inspect the key file {}: {e}",
            path.display()
        ))
    })?;
    let unsafe_key =
        |why: String| KeyError::Unsafe(format!("the key file {} {why}", path.display()));
    if !meta.is_file() {
        return Err(unsafe_key("is not a regular file".into()));
    }
    if meta.uid() != euid() {
        return Err(unsafe_key(format!(
            "belongs to uid {}, not to this user (uid {}): anyone who could write it knows the key",
            meta.uid(),
            euid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_key(format!(
            "has mode {:04o}: others may read it; run `chmod 600 {}`",
            meta.mode() & 0o7777,
            path.display()
        )));
    }
    if meta.len() > MAX_KEY_BYTES {
        return Err(unsafe_key(format!(
            "holds {} bytes, more than a key ({MAX_KEY_BYTES} at most)",
            meta.len()
        )));
    }
    let mut key = Vec::new();
    file.read_to_end(&mut key).map_err(|e| {
        KeyError::Unavailable(format!("cannot read the key file {}: {e}", path.display()))
    })?;
    let key = key.trim_ascii().to_vec();
    if key.len() < MIN_KEY_BYTES {
        return Err(unsafe_key(format!(
            "holds {} bytes; a key needs at least {MIN_KEY_BYTES} (delete it to get a new one)",
            key.len()
        )));
    }
    Ok(key)
}

/// Writes a fresh key to a private temporary file and links it into place,
/// which fails if another process got there first (then its key stands).
fn create_key(path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let mut bytes = [0u8; 32];
    fill_random(&mut bytes)?;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let mut tag = [0u8; 8];
    fill_random(&mut tag)?;
    let tmp = dir.join(format!(
        ".key.{}.{:016x}",
        std::process::id(),
        u64::from_le_bytes(tag)
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(format!("{hex}\n").as_bytes())?;
            f.sync_all()
        })
        .and_then(|()| match fs::hard_link(&tmp, path) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        });
    let _ = fs::remove_file(&tmp);
    written
}

/// Hashes one named, length-prefixed field.
fn field(h: &mut Sha256, name: &str, value: &[u8]) {
    h.update(name.as_bytes());
    h.update([0]);
    h.update((value.len() as u64).to_le_bytes());
    h.update(value);
}

/// What every rank of a job holds and a stranger lacks.
enum Credential {
    Explicit(std::ffi::OsString),
    Key(Vec<u8>),
    /// Nothing: the address alone (loopback, or by explicit consent).
    Open,
}

fn credential(addr: SocketAddr) -> Result<Credential> {
    credential_from(
        addr,
        key_file_path(),
        rccl_env::var("NCCL_COMM_SECRET")
            .or_else(|| rccl_env::var("RCCL_COMM_SECRET"))
            .map(std::ffi::OsString::from),
        rccl_env::var("RCCL_INSECURE_ADDRESS_SECRET").is_some_and(|v| v.trim() == "1"),
    )
}

fn credential_from(
    addr: SocketAddr,
    key_file: Option<PathBuf>,
    explicit: Option<std::ffi::OsString>,
    insecure: bool,
) -> Result<Credential> {
    if let Some(s) = explicit.filter(|s| !s.is_empty()) {
        return Ok(Credential::Explicit(s));
    }
    if insecure {
        tracing::warn!(
            "RCCL_INSECURE_ADDRESS_SECRET=1: the communicator at {addr} is open to anyone who can reach it"
        );
        return Ok(Credential::Open);
    }
    let why = match key_file {
        None => "HOME is not set, so there is no ~/.rccl/key".to_string(),
        Some(path) => match load_or_create_key(&path) {
            Ok(key) => return Ok(Credential::Key(key)),
            Err(KeyError::Unsafe(why)) => {
                return Err(Error::InvalidUsage(format!(
                    "refusing to derive the secret of {addr}: {why}"
                )))
            }
            Err(KeyError::Unavailable(why)) => why,
        },
    };
    if !addr.ip().is_loopback() {
        return Err(Error::InvalidUsage(format!(
            "refusing to join {addr} without a secret: {why}. Set NCCL_COMM_SECRET to a value \
             every rank shares, or give every rank the key file (RCCL_KEY_FILE, default ~/.rccl/key), \
             or set RCCL_INSECURE_ADDRESS_SECRET=1 to let anyone who can reach {addr} join"
        )));
    }
    tracing::warn!(
        "{why}; the communicator at {addr} (loopback) is open to every user of this host"
    );
    Ok(Credential::Open)
}

/// The secret of the communicator at `addr` (see the module's text).
pub(crate) fn address_secret(addr: SocketAddr) -> Result<AddressSecret> {
    let credential = credential(addr)?;
    let mut h = Sha256::new();
    h.update(b"rccl-rs comm id secret v2\0");
    field(&mut h, "address", addr.to_string().as_bytes());
    match &credential {
        Credential::Explicit(s) => field(&mut h, "secret", s.as_encoded_bytes()),
        Credential::Key(key) => field(&mut h, "key", key),
        Credential::Open => field(&mut h, "open", b""),
    }
    let job = job_name();
    if let Some(job) = &job {
        field(&mut h, "job", job.as_bytes());
    }
    Ok(AddressSecret {
        secret: Secret(h.finalize().into()),
        job,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "rccl-key-test-{}-{name}-{:x}",
            std::process::id(),
            Secret::random().0[0]
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn the_key_is_made_once_private_and_shared_by_racing_ranks() {
        let dir = scratch("race");
        let path = dir.join(".rccl").join("key");
        fs::create_dir_all(&dir).unwrap();
        let keys: Vec<Vec<u8>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| load_or_create_key(&path).unwrap()))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
        assert_eq!(keys[0].len(), 64);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        // Nothing but the key is left in its directory.
        assert_eq!(fs::read_dir(path.parent().unwrap()).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_key_others_may_read_or_a_short_one_is_refused() {
        let dir = scratch("loose");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        fs::write(&path, "0123456789abcdef0123456789abcdef\n").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        match load_or_create_key(&path) {
            Err(KeyError::Unsafe(why)) => assert!(why.contains("chmod 600"), "{why}"),
            other => panic!("{other:?}"),
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            load_or_create_key(&path).unwrap(),
            b"0123456789abcdef0123456789abcdef"
        );
        fs::write(&path, "short\n").unwrap();
        assert!(matches!(
            load_or_create_key(&path),
            Err(KeyError::Unsafe(_))
        ));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_key_only_loopback_is_open() {
        let nowhere = Some(PathBuf::from("/proc/rccl-no-such-dir/key"));
        let remote: SocketAddr = "10.1.2.3:29500".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:29500".parse().unwrap();
        let e = credential_from(remote, nowhere.clone(), None, false)
            .err()
            .expect("a remote address without a key is refused");
        let msg = e.to_string();
        assert!(
            msg.contains("NCCL_COMM_SECRET") && msg.contains("RCCL_INSECURE_ADDRESS_SECRET=1"),
            "{msg}"
        );
        assert!(matches!(
            credential_from(local, nowhere.clone(), None, false),
            Ok(Credential::Open)
        ));
        assert!(matches!(
            credential_from(remote, nowhere, None, true),
            Ok(Credential::Open)
        ));
    }

    #[test]
    fn the_innermost_launcher_names_the_job() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(job_name_from(env(&[])), None);
        assert_eq!(
            job_name_from(env(&[("SLURM_JOB_ID", "77"), ("SLURM_STEP_ID", "3")])),
            Some("SLURM_JOB_ID=77 SLURM_STEP_ID=3".into())
        );
        assert_eq!(
            job_name_from(env(&[
                ("SLURM_JOB_ID", "77"),
                ("OMPI_MCA_ess_base_jobid", "12345")
            ])),
            Some("OMPI_MCA_ess_base_jobid=12345".into())
        );
        assert_eq!(
            job_name_from(env(&[
                ("TORCHELASTIC_RUN_ID", "abc"),
                ("SLURM_JOB_ID", "77")
            ])),
            Some("TORCHELASTIC_RUN_ID=abc".into())
        );
        // torchrun without --rdzv-id says "none": no name, and no falling
        // through to Slurm, whose step may differ between hosts.
        assert_eq!(
            job_name_from(env(&[
                ("TORCHELASTIC_RUN_ID", "none"),
                ("SLURM_JOB_ID", "77")
            ])),
            None
        );
    }
}
