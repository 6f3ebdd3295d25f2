//! rccl-rs's settings and what every kind of plug-in shares.
//!
//! [`var`] is the one reader of the `NCCL_*` and `RCCL_*` variables the
//! crates of rccl-rs read. As with NCCL, a loaded environment plug-in
//! answers every lookup: its value wins, also over one set in the
//! process's environment (a site's plug-in may enforce a setting; one that
//! lets users override reads the environment itself), and a name it has no
//! value for (it returns null) falls back to the process's environment.
//! The plug-in: `NCCL_ENV_PLUGIN` (read from the environment itself)
//! names it by NCCL's rules ([`load`], kind `env`), and the newest of
//! `ncclEnvPlugin_v2` and `ncclEnvPlugin_v1` it exports is initialized
//! once, with the NCCL API level rccl-rs implements. Its `finalize` is
//! never called: it serves the process to its end.
//!
//! [`logger`] is the `ncclDebugLogger_t` every plug-in is given: messages go
//! to this process's log (`tracing` events), under the subsystem their
//! flags name; a warning is also kept per thread ([`take_warning`]) as the
//! text of the error of the plug-in call that logged it.

#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_ulong, CStr, CString};
use std::sync::{Mutex, OnceLock};

pub mod load;

pub use load::library_names;
use load::{Kind, Library, Subsystem};

/// The NCCL API level rccl-rs implements (ffi's `NCCL_VERSION_CODE`),
/// which the environment plug-in's `init` is told.
const NCCL_VERSION: (u8, u8, u8) = (2, 32, 6);

/// `ncclDebugLogLevel`: `NCCL_LOG_WARN`.
pub const LOG_WARN: c_int = 2;
/// `NCCL_LOG_INFO`.
pub const LOG_INFO: c_int = 3;
/// `ncclDebugLogSubSys`: `NCCL_NET`.
pub const LOG_NET: c_ulong = 0x10;
/// `NCCL_TUNING`.
pub const LOG_TUNING: c_ulong = 0x40;
/// `NCCL_ENV`.
pub const LOG_ENV: c_ulong = 0x80;

/// `ncclDebugLogger_t`.
pub type Logger = unsafe extern "C" fn(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    fmt: *const c_char,
    ...
);

extern "C" {
    /// `logger.c`: the variadic logger plug-ins are given.
    fn rccl_plugin_logger(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    );
}

/// The logger plug-ins are given.
pub fn logger() -> Logger {
    rccl_plugin_logger
}

thread_local! {
    /// The last warning a plug-in logged on this thread.
    static LAST_WARNING: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Takes the last warning a plug-in logged on this thread, if any.
pub fn take_warning() -> Option<String> {
    LAST_WARNING.with(|last| last.borrow_mut().take())
}

/// Where `logger.c` hands each formatted message.
///
/// # Safety
/// `file` and `message` are null or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn rccl_plugin_log_sink(
    level: c_int,
    flags: c_ulong,
    file: *const c_char,
    line: c_int,
    message: *const c_char,
) {
    let text = |p: *const c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: non-null strings from logger.c are NUL-terminated.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let (file, message) = (text(file), text(message));
    if level == LOG_WARN {
        LAST_WARNING.with(|last| *last.borrow_mut() = Some(message.clone()));
    }
    macro_rules! log {
        ($target:literal, $prefix:literal) => {
            match level {
                LOG_WARN => tracing::warn!(target: $target, "{} {file}:{line} {message}", $prefix),
                LOG_INFO => tracing::info!(target: $target, "{} {message}", $prefix),
                _ => tracing::trace!(target: $target, "{} {message}", $prefix),
            }
        };
    }
    if flags & LOG_NET != 0 || flags & (LOG_TUNING | LOG_ENV) == 0 {
        log!("NET", "NET/Plugin");
    } else if flags & LOG_TUNING != 0 {
        log!("TUNING", "TUNER/Plugin");
    } else {
        log!("ENV", "ENV/Plugin");
    }
}

type GetEnv = unsafe extern "C" fn(*const c_char) -> *const c_char;
type NcclResult = c_int;

/// `ncclEnv_v1_t`.
#[repr(C)]
struct EnvV1 {
    name: *const c_char,
    init: Option<unsafe extern "C" fn(u8, u8, u8, *const c_char) -> NcclResult>,
    finalize: Option<unsafe extern "C" fn() -> NcclResult>,
    get_env: Option<GetEnv>,
}

/// `ncclEnv_v2_t`: v1's `init` with the logger.
#[repr(C)]
struct EnvV2 {
    name: *const c_char,
    init: Option<unsafe extern "C" fn(u8, u8, u8, *const c_char, Logger) -> NcclResult>,
    finalize: Option<unsafe extern "C" fn() -> NcclResult>,
    get_env: Option<GetEnv>,
}

/// A loaded, initialized environment plug-in.
struct EnvPlugin {
    get_env: GetEnv,
    /// Serializes `getEnv`: a value it returns stays valid only until the
    /// next call for the same name, so each is copied under this lock.
    calls: Mutex<()>,
}

/// The environment plug-in's kind.
const ENV_PLUGIN: Kind = Kind {
    file: "env",
    symbol: "ncclEnvPlugin_v",
    interface: "ncclEnv",
    versions: &[2, 1],
    subsystem: Subsystem::InitEnv,
    without: "settings come from the environment",
};

/// Initializes the environment plug-in `library` exports; the error says
/// why it cannot serve.
fn init(library: &Library) -> Result<EnvPlugin, String> {
    let suffix = c"";
    let (major, minor, patch) = NCCL_VERSION;
    let (init, get_env) = if library.version == 2 {
        // SAFETY: version 2's table is an `ncclEnv_v2_t`.
        let table = unsafe { library.table::<EnvV2>() };
        // SAFETY: the plug-in's own init, with the version and a logger
        // that lives for the process.
        let init = table
            .init
            .map(|f| unsafe { f(major, minor, patch, suffix.as_ptr(), logger()) });
        (init, table.get_env)
    } else {
        // SAFETY: version 1's table is an `ncclEnv_v1_t`.
        let table = unsafe { library.table::<EnvV1>() };
        // SAFETY: the plug-in's own init, with the version.
        let init = table
            .init
            .map(|f| unsafe { f(major, minor, patch, suffix.as_ptr()) });
        (init, table.get_env)
    };
    let (name, path) = (&library.name, &library.path);
    let get_env = get_env.ok_or_else(|| format!("{name} ({path}) has no getEnv"))?;
    match init {
        Some(0) | None => Ok(EnvPlugin {
            get_env,
            calls: Mutex::new(()),
        }),
        Some(code) => Err(format!(
            "{name} ({path}): init returned {code}{}",
            take_warning().map_or(String::new(), |w| format!(": {w}"))
        )),
    }
}

/// The environment plug-in of this process, loaded on first use.
fn plugin() -> Option<&'static EnvPlugin> {
    static PLUGIN: OnceLock<Option<EnvPlugin>> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            // The plug-in's own variable comes from the environment itself.
            let library = ENV_PLUGIN.load(std::env::var("NCCL_ENV_PLUGIN").ok().as_deref(), &[])?;
            init(&library)
                .map_err(|why| {
                    tracing::warn!(target: "INIT|ENV", "ENV/Plugin: not used: {why}");
                })
                .ok()
        })
        .as_ref()
}

/// The value of the setting `name` (an `NCCL_*` or `RCCL_*` variable):
/// the environment plug-in's if it has one, else the process's
/// environment's, else `None`.
pub fn var(name: &str) -> Option<String> {
    plugin_var(name)
        .or_else(|| std::env::var_os(name).map(|value| value.to_string_lossy().into_owned()))
}

/// What the environment plug-in, if one is loaded, says of `name`.
fn plugin_var(name: &str) -> Option<String> {
    let plugin = plugin()?;
    let key = CString::new(name).ok()?;
    let _serial = plugin.calls.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: the plug-in's own getEnv with a NUL-terminated name; what it
    // returns is null or a NUL-terminated string valid until the next call
    // for this name, which the lock holds off until it is copied.
    let value = unsafe { (plugin.get_env)(key.as_ptr()) };
    if value.is_null() {
        return None;
    }
    // SAFETY: as above.
    Some(
        unsafe { CStr::from_ptr(value) }
            .to_string_lossy()
            .into_owned(),
    )
}
