//! The secret of a communicator joined through an address
//! (`NCCL_COMM_ID=host:port`, or torchrun's `MASTER_ADDR:MASTER_PORT`).
//!
//! Every rank derives it alone, from what all ranks of one job share and a
//! stranger who can reach the address lacks:
//!
//! - `NCCL_COMM_SECRET` (or `RCCL_COMM_SECRET`) when set; otherwise
//! - the user's key file, `RCCL_KEY_FILE` or `~/.rccl/key`: created on first
//!   use (32 random bytes as 64 hex digits and a newline, mode 0600, in a
//!   directory of mode 0700, atomically, so ranks that start together on a
//!   shared home directory agree on one). Ranks on hosts that share the
//!   home directory (torchrun, Slurm, mpirun clusters usually do) need no
//!   step.
//! - and the job's name where the launcher gives one
//!   (`TORCHELASTIC_RUN_ID`, `PMIX_NAMESPACE`, `OMPI_MCA_ess_base_jobid`,
//!   `SLURM_JOB_ID` and `SLURM_STEP_ID`), so that two jobs of one user on
//!   one address cannot join each other's communicator.
//!
//! The key file is trusted only as this library leaves it: opened without
//! following a symbolic link and without blocking (a FIFO cannot hang
//! the job), a regular file of this user with mode 0600 or stricter and
//! exactly the bytes of a key, in a directory of this user that no one
//! else may write to (who could, could swap the key). Anything else is an
//! error naming the file and the fix. With no key file to be had (no home
//! directory, a read-only one) no address is joined unless
//! `RCCL_INSECURE_ADDRESS_SECRET=1` accepts that anyone who can reach it
//! can join: an address secret without a key would be known to every
//! user of the host, loopback included.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rccl_transports::auth_tcp::{fill_random, Secret};
use rccl_transports::effective_uid;
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
/// Random bytes of a key.
const KEY_BYTES: usize = 32;
/// Bytes of a key file: the key in hex digits and a newline.
const KEY_FILE_BYTES: usize = 2 * KEY_BYTES + 1;

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
    /// There is one, but it is not as this library leaves a key file:
    /// others may read or replace it, or it is not a key.
    Unsafe(String),
}

/// The key in `path`, created (with its directory) if there is none.
pub(crate) fn load_or_create_key(path: &Path) -> std::result::Result<Vec<u8>, KeyError> {
    let unavailable =
        |what: &str, e: io::Error| KeyError::Unavailable(format!("{what} {}: {e}", path.display()));
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    check_dir(dir)?;
    for _ in 0..2 {
        match open_no_follow(path) {
            Ok(file) => return read_key(path, file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                create_key(dir, path).map_err(|e| unavailable("cannot create the key file", e))?
            }
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                return Err(KeyError::Unsafe(format!(
                    "the key file {} is a symbolic link, which another user may have planted; \
                     remove it (`rm {}`) to get a new key, or put the key file itself there",
                    path.display(),
                    path.display()
                )))
            }
            Err(e) => return Err(unavailable("cannot open the key file", e)),
        }
    }
    Err(KeyError::Unavailable(format!(
        "the key file {} vanished while it was being created",
        path.display()
    )))
}

/// Opens `path` for reading, refusing a symbolic link (`ELOOP`) and never
/// waiting for a writer (a FIFO).
fn open_no_follow(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

/// Checks (creating it with mode 0700 if missing) the key file's
/// directory: itself no symbolic link, this user's, writable by no one
/// else.
fn check_dir(dir: &Path) -> std::result::Result<(), KeyError> {
    let unsafe_dir =
        |why: String| KeyError::Unsafe(format!("the key directory {} {why}", dir.display()));
    let open = || {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dir)
    };
    let opened = match open() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => open(),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => open(),
                Err(e) => {
                    return Err(KeyError::Unavailable(format!(
                        "cannot create the key directory {}: {e}",
                        dir.display()
                    )))
                }
            }
        }
        other => other,
    };
    let meta = match opened.and_then(|d| d.metadata()) {
        Ok(meta) => meta,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            return Err(unsafe_dir(format!(
                "is a symbolic link or not a directory, which another user may have planted; \
                 remove it (`rm {}`) to have a new one made, or set RCCL_KEY_FILE",
                dir.display()
            )))
        }
        Err(e) => {
            return Err(KeyError::Unavailable(format!(
                "cannot open the key directory {}: {e}",
                dir.display()
            )))
        }
    };
    if meta.uid() != effective_uid() {
        return Err(unsafe_dir(format!(
            "belongs to uid {}, not to this user (uid {}): its owner could swap the key; \
             set RCCL_KEY_FILE to a file in a directory of your own",
            meta.uid(),
            effective_uid()
        )));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "has mode {:04o}: others may swap the key in it; run `chmod 700 {}`",
            meta.mode() & 0o7777,
            dir.display()
        )));
    }
    Ok(())
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
    let remake = format!(
        "delete it (`rm {}`) to get a new key, or copy the key file of the job's other hosts",
        path.display()
    );
    if !meta.is_file() {
        return Err(unsafe_key(format!("is not a regular file; {remake}")));
    }
    if meta.uid() != effective_uid() {
        return Err(unsafe_key(format!(
            "belongs to uid {}, not to this user (uid {}): anyone who could write it knows the key; {remake}",
            meta.uid(),
            effective_uid()
        )));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(unsafe_key(format!(
            "has mode {:04o}: others may read it; run `chmod 600 {}`",
            meta.mode() & 0o7777,
            path.display()
        )));
    }
    if meta.len() != KEY_FILE_BYTES as u64 {
        return Err(unsafe_key(format!(
            "holds {} bytes, not the {KEY_FILE_BYTES} of a key ({} hex digits and a newline); {remake}",
            meta.len(),
            2 * KEY_BYTES
        )));
    }
    let mut text = Vec::with_capacity(KEY_FILE_BYTES);
    Read::take(&mut file, KEY_FILE_BYTES as u64 + 1)
        .read_to_end(&mut text)
        .map_err(|e| {
            KeyError::Unavailable(format!("cannot read the key file {}: {e}", path.display()))
        })?;
    let key = match text.strip_suffix(b"\n") {
        Some(key) if text.len() == KEY_FILE_BYTES && key.iter().all(u8::is_ascii_hexdigit) => key,
        _ => {
            return Err(unsafe_key(format!(
                "is not a key ({} hex digits and a newline); {remake}",
                2 * KEY_BYTES
            )))
        }
    };
    if key.iter().all(|&digit| digit == b'0') {
        return Err(unsafe_key(format!("holds a key of zeros; {remake}")));
    }
    Ok(key.to_vec())
}

/// Writes a fresh key to a private temporary file in `dir` and links it
/// into place, which fails if another process got there first (then its
/// key stands).
fn create_key(dir: &Path, path: &Path) -> io::Result<()> {
    let mut bytes = [0u8; KEY_BYTES];
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
    /// Nothing: the address alone (by explicit consent).
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
    Err(Error::InvalidUsage(format!(
        "refusing to join {addr} without a secret: {why}. Set NCCL_COMM_SECRET to a value \
         every rank shares, or give every rank the key file (RCCL_KEY_FILE, default ~/.rccl/key), \
         or set RCCL_INSECURE_ADDRESS_SECRET=1 to let anyone who can reach {addr} join"
    )))
}

/// The secret of the communicator at `addr` (see the module's text).
pub(crate) fn address_secret(addr: SocketAddr) -> Result<AddressSecret> {
    // Before the first communicator exists: its warnings must print.
    crate::debug::init();
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

    const GOOD_KEY: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n";

    /// The refusal of the key at `path`, within 5 s (a key file that
    /// blocks its reader must not hang the test).
    fn refusal(path: &Path) -> String {
        let (tx, rx) = std::sync::mpsc::channel();
        let path = path.to_path_buf();
        std::thread::spawn(move || tx.send(load_or_create_key(&path)));
        match rx.recv_timeout(std::time::Duration::from_secs(5)) {
            Ok(Err(KeyError::Unsafe(why))) => why,
            Ok(other) => panic!("not refused: {other:?}"),
            Err(_) => panic!("reading the key file still blocks after 5 s"),
        }
    }

    #[test]
    fn a_key_others_may_read_or_one_not_as_written_is_refused() {
        let dir = scratch("loose");
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("key");
        fs::write(&path, GOOD_KEY).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(refusal(&path).contains("chmod 600"));
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            load_or_create_key(&path).unwrap(),
            GOOD_KEY.trim_end().as_bytes()
        );
        let zeros = format!("{}\n", "0".repeat(64));
        for (text, says) in [
            ("short\n", "holds 6 bytes"),
            (&"\0".repeat(17), "holds 17 bytes"),
            (&zeros, "zeros"),
            (&GOOD_KEY.replace('f', "g"), "is not a key"),
            (&GOOD_KEY.replace('\n', " "), "is not a key"),
        ] {
            fs::write(&path, text).unwrap();
            let why = refusal(&path);
            assert!(
                why.contains(says) && why.contains(&format!("rm {}", path.display())),
                "{text:?}: {why}"
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_symlink_fifo_or_open_directory_is_refused_naming_path_and_fix() {
        let dir = scratch("odd");
        let keys = dir.join(".rccl");
        fs::create_dir_all(&keys).unwrap();
        fs::set_permissions(&keys, fs::Permissions::from_mode(0o700)).unwrap();
        let path = keys.join("key");
        // A dangling symbolic link, and one to a good key.
        let good = dir.join("good");
        fs::write(&good, GOOD_KEY).unwrap();
        fs::set_permissions(&good, fs::Permissions::from_mode(0o600)).unwrap();
        for target in [dir.join("nowhere"), good.clone()] {
            std::os::unix::fs::symlink(&target, &path).unwrap();
            let why = refusal(&path);
            assert!(
                why.contains("symbolic link") && why.contains(&format!("rm {}", path.display())),
                "{why}"
            );
            fs::remove_file(&path).unwrap();
        }
        // A FIFO: refused at once, never waited on.
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        assert!(refusal(&path).contains("not a regular file"));
        fs::remove_file(&path).unwrap();
        // A directory others may write to.
        fs::set_permissions(&keys, fs::Permissions::from_mode(0o777)).unwrap();
        let why = refusal(&path);
        assert!(
            why.contains(&format!("chmod 700 {}", keys.display())),
            "{why}"
        );
        // The directory a symbolic link (to a private one).
        fs::set_permissions(&keys, fs::Permissions::from_mode(0o700)).unwrap();
        let linked = dir.join("linked");
        std::os::unix::fs::symlink(&keys, &linked).unwrap();
        let why = refusal(&linked.join("key"));
        assert!(why.contains("symbolic link or not a directory"), "{why}");
        assert!(!path.exists(), "no key was made through the refusals");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_key_no_address_is_open_without_consent() {
        let nowhere = Some(PathBuf::from("/proc/rccl-no-such-dir/key"));
        let remote: SocketAddr = "10.1.2.3:29500".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:29500".parse().unwrap();
        for addr in [remote, local] {
            for key_file in [nowhere.clone(), None] {
                let e = credential_from(addr, key_file, None, false)
                    .err()
                    .expect("an address without a key is refused");
                let msg = e.to_string();
                assert!(
                    msg.contains("NCCL_COMM_SECRET")
                        && msg.contains("RCCL_INSECURE_ADDRESS_SECRET=1"),
                    "{msg}"
                );
            }
            assert!(matches!(
                credential_from(addr, nowhere.clone(), None, true),
                Ok(Credential::Open)
            ));
        }
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
