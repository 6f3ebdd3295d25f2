//! rccl-rs's settings and what every kind of plug-in shares.
//!
//! [`var`] is the one reader of the `NCCL_*` and `RCCL_*` variables the
//! crates of rccl-rs read. As with NCCL, a loaded environment plug-in
//! answers every lookup: its value wins, also over one set in the
//! process's environment (a site's plug-in may enforce a setting; one that
//! lets users override reads the environment itself), and a name it has no
//! value for (it returns null) falls back to the process's environment.
//! The plug-in: `NCCL_ENV_PLUGIN` (read from the environment
//! itself) names it by NCCL's rules ([`library_names`] with kind `env`:
//! unset, `libnccl-env.so` if present; `X`, `libnccl-env-X.so` then `X`;
//! `none`, no plug-in), and the newest of `ncclEnvPlugin_v2` and
//! `ncclEnvPlugin_v1` it exports is initialized once, with the NCCL API
//! level rccl-rs implements. Its `finalize` is never called: it serves the
//! process to its end.
//!
//! [`logger`] is the `ncclDebugLogger_t` every plug-in is given: messages go
//! to this process's log (`tracing` events), under the subsystem their
//! flags name; a warning is also kept per thread ([`take_warning`]) as the
//! text of the error of the plug-in call that logged it.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_ulong, CStr, CString};
use std::sync::{Mutex, OnceLock};

/// The NCCL API level rccl-rs implements (ffi's `NCCL_VERSION_CODE`),
/// which the environment plug-in's `init` is told.
const NCCL_VERSION: (u8, u8, u8) = (2, 32, 3);

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

/// The library names NCCL tries for a plug-in of `kind` (`net`, `tuner`,
/// `profiler`, `env`) that its variable names as `entry` (`None`: unset):
/// `libnccl-<kind>.so` by default; else `libnccl-<kind>-<entry>.so`
/// (unless `entry` is a path or a `lib*.so` name), then `entry` itself.
pub fn library_names(kind: &str, entry: Option<&str>) -> Vec<String> {
    let Some(entry) = entry else {
        return vec![format!("libnccl-{kind}.so")];
    };
    let is_library = entry.starts_with("lib") && entry.ends_with(".so");
    let mut names = Vec::with_capacity(2);
    if !entry.contains('/') && !is_library {
        names.push(format!("libnccl-{kind}-{entry}.so"));
    }
    names.push(entry.to_string());
    names
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

/// Why a library could not serve as the environment plug-in.
fn load(name: &str) -> Result<(EnvPlugin, String, u32), String> {
    // SAFETY: loading a library runs its initializers; an environment
    // plug-in is made to be loaded into the process this way.
    let library = unsafe { libloading::Library::new(name) }.map_err(|e| format!("{name}: {e}"))?;
    // The plug-in serves the process to its end.
    let library: &'static libloading::Library = Box::leak(Box::new(library));
    fn symbol<T>(library: &'static libloading::Library, name: &[u8]) -> Option<&'static T> {
        // SAFETY: an `ncclEnvPlugin_vN` symbol is the plug-in's table of
        // version N, whose layout `T` declares; the library stays loaded.
        unsafe { library.get::<*const T>(name).ok().map(|s| &**s) }
    }
    let suffix = c"";
    let (major, minor, patch) = NCCL_VERSION;
    let (plugin_name, version, init, get_env) =
        if let Some(t) = symbol::<EnvV2>(library, b"ncclEnvPlugin_v2\0") {
            // SAFETY: the plug-in's own init, with the version and a logger
            // that lives for the process.
            let init = t
                .init
                .map(|f| unsafe { f(major, minor, patch, suffix.as_ptr(), logger()) });
            (t.name, 2, init, t.get_env)
        } else if let Some(t) = symbol::<EnvV1>(library, b"ncclEnvPlugin_v1\0") {
            // SAFETY: the plug-in's own init, with the version.
            let init = t
                .init
                .map(|f| unsafe { f(major, minor, patch, suffix.as_ptr()) });
            (t.name, 1, init, t.get_env)
        } else {
            return Err(format!(
                "{name} exports neither ncclEnvPlugin_v2 nor ncclEnvPlugin_v1"
            ));
        };
    let plugin_name = if plugin_name.is_null() {
        "env".to_string()
    } else {
        // SAFETY: the table's name is a NUL-terminated string.
        unsafe { CStr::from_ptr(plugin_name) }
            .to_string_lossy()
            .into_owned()
    };
    let get_env = get_env.ok_or_else(|| format!("{plugin_name} ({name}) has no getEnv"))?;
    match init {
        Some(0) | None => Ok((
            EnvPlugin {
                get_env,
                calls: Mutex::new(()),
            },
            plugin_name,
            version,
        )),
        Some(code) => Err(format!(
            "{plugin_name} ({name}): init returned {code}{}",
            take_warning().map_or(String::new(), |w| format!(": {w}"))
        )),
    }
}

/// The environment plug-in of this process, loaded on first use.
fn plugin() -> Option<&'static EnvPlugin> {
    static PLUGIN: OnceLock<Option<EnvPlugin>> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let var = std::env::var("NCCL_ENV_PLUGIN").ok();
            if var
                .as_deref()
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
            {
                return None;
            }
            let mut tried = Vec::new();
            for name in library_names("env", var.as_deref()) {
                match load(&name) {
                    Ok((plugin, plugin_name, version)) => {
                        tracing::info!(
                            target: "ENV",
                            "ENV/Plugin: loaded {plugin_name} (ncclEnv v{version}) from {name}"
                        );
                        return Some(plugin);
                    }
                    Err(why) => tried.push(why),
                }
            }
            // Named but not loaded is worth a warning; the default absent
            // is the common case.
            if var.is_some() {
                tracing::warn!(target: "ENV", "ENV/Plugin: not loaded: {}", tried.join("; "));
            }
            None
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_follow_nccls_rules() {
        assert_eq!(library_names("env", None), ["libnccl-env.so"]);
        assert_eq!(
            library_names("tuner", Some("x")),
            ["libnccl-tuner-x.so", "x"]
        );
        assert_eq!(library_names("env", Some("/p/a.so")), ["/p/a.so"]);
        assert_eq!(library_names("net", Some("libfoo.so")), ["libfoo.so"]);
    }
}
