//! Finding and opening a plug-in library, by NCCL's rules for every kind
//! (environment, tuner, profiler; the net host uses [`library_names`]).
//!
//! A kind's variable (`NCCL_<KIND>_PLUGIN`) names the library: unset or
//! empty, `libnccl-<kind>.so`; `none` (any case), no plug-in; a value `X`,
//! `X` itself (a path or a name the dynamic loader searches for), then,
//! unless `X` holds a `/` or already reads `lib*.so`,
//! `libnccl-<kind>-X.so`, the order NCCL's loader tries them in. Of
//! the first library that opens and exports a table of the kind, the
//! newest version's table is taken; a library stays loaded to the end of
//! the process, since its tables and the contexts it gives are used
//! until then. The outcome is logged under NCCL's subsystem of the kind.

use std::ffi::{c_char, c_void, CStr};
use std::ptr::NonNull;

/// NCCL's subsystems a kind's loading is logged under.
#[derive(Clone, Copy, Debug)]
pub enum Subsystem {
    /// `NCCL_INIT` (profiler plug-ins).
    Init,
    /// `NCCL_INIT|NCCL_TUNING` (tuner plug-ins).
    InitTuning,
    /// `NCCL_INIT|NCCL_ENV` (the environment plug-in).
    InitEnv,
}

/// A kind of plug-in: how its libraries are named, the symbol of its
/// table, and what running without one means.
#[derive(Debug)]
pub struct Kind {
    /// The kind in its libraries' names: `libnccl-<file>.so`.
    pub file: &'static str,
    /// Its table's symbol less the version number: `ncclTunerPlugin_v`.
    pub symbol: &'static str,
    /// NCCL's name of its interface, for the log: `ncclTuner`.
    pub interface: &'static str,
    /// The versions of the table understood here, newest first.
    pub versions: &'static [u32],
    /// Where its loading is logged.
    pub subsystem: Subsystem,
    /// What the process does without one, for the log.
    pub without: &'static str,
}

/// A plug-in library opened for the rest of the process, and the newest
/// table of its kind that it exports.
#[derive(Debug)]
pub struct Library {
    /// The name it was opened by.
    pub path: String,
    /// The version of its table.
    pub version: u32,
    /// The plug-in's own name (its table's first field), or the kind's
    /// when that is null.
    pub name: String,
    table: NonNull<c_void>,
}

// SAFETY: the table is static data of a library that is never unloaded;
// NCCL calls plug-ins from any thread.
unsafe impl Send for Library {}
// SAFETY: as above; nothing in `Library` changes after loading.
unsafe impl Sync for Library {}

impl Library {
    /// The plug-in's table.
    ///
    /// # Safety
    /// `T` is the layout of the kind's table at [`Library::version`].
    pub unsafe fn table<T>(&self) -> &'static T {
        // SAFETY: the symbol's address is the table, which lives as long
        // as the library, that is to the end of the process; the caller
        // vouches for its layout.
        unsafe { self.table.cast::<T>().as_ref() }
    }
}

/// The library names NCCL tries for a plug-in of `kind` (`net`, `tuner`,
/// `profiler`, `env`) whose variable is `value` (`None`: unset), in
/// order; the value `none` is the caller's to test.
pub fn library_names(kind: &str, value: Option<&str>) -> Vec<String> {
    let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return vec![format!("libnccl-{kind}.so")];
    };
    let mut names = vec![value.to_string()];
    let is_library = value.starts_with("lib") && value.ends_with(".so");
    if !value.contains('/') && !is_library {
        names.push(format!("libnccl-{kind}-{value}.so"));
    }
    names
}

/// Whether a variable's value turns a kind of plug-in off.
fn is_none(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
}

impl Kind {
    /// Loads the plug-in `value` (its variable's value; `None`: unset)
    /// names or, when none of those opens, the first of `fallback` that
    /// exports a table of this kind; `None` when the value is `none` or
    /// nothing served. A library that was named but not loaded is a
    /// warning; the default one absent is only logged.
    pub fn load(&self, value: Option<&str>, fallback: &[String]) -> Option<Library> {
        if is_none(value) {
            return None;
        }
        let mut tried = Vec::new();
        let found = self
            .open_first(&library_names(self.file, value), &mut tried)
            .or_else(|| self.open_first(fallback, &mut tried));
        let prefix = self.file.to_ascii_uppercase();
        match &found {
            Some(library) => self.info(format_args!(
                "{prefix}/Plugin: loaded {} ({} v{}) from {}",
                library.name, self.interface, library.version, library.path
            )),
            None if value.is_some() => self.warn(format_args!(
                "{prefix}/Plugin: not loaded ({}); {}",
                tried.join("; "),
                self.without
            )),
            None => self.info(format_args!(
                "{prefix}/Plugin: no {} plug-in ({}); {}",
                self.file,
                tried.join("; "),
                self.without
            )),
        }
        found
    }

    /// Opens the first of `names` that loads and exports a table of this
    /// kind; `tried` collects why each other one was passed over.
    fn open_first(&self, names: &[String], tried: &mut Vec<String>) -> Option<Library> {
        names.iter().find_map(|name| match self.open(name) {
            Ok(library) => Some(library),
            Err(why) => {
                tried.push(why);
                None
            }
        })
    }

    /// Opens `name` and takes its newest table of this kind; the error
    /// names the library and what it lacks.
    pub fn open(&self, name: &str) -> Result<Library, String> {
        // SAFETY: loading a library runs its initializers; a plug-in is
        // made to be loaded into the process this way.
        let library =
            unsafe { libloading::Library::new(name) }.map_err(|e| format!("{name}: {e}"))?;
        // The plug-in serves the process to its end.
        let library: &'static libloading::Library = Box::leak(Box::new(library));
        let (table, version) = self
            .versions
            .iter()
            .find_map(|&version| {
                let symbol = format!("{}{version}\0", self.symbol);
                // SAFETY: the symbol is the address of the plug-in's table,
                // read as an address only.
                let table = unsafe { library.get::<*mut c_void>(symbol.as_bytes()) }.ok()?;
                NonNull::new(*table).map(|table| (table, version))
            })
            .ok_or_else(|| {
                let (newest, oldest) = (self.versions[0], self.versions[self.versions.len() - 1]);
                format!(
                    "{name} exports none of {symbol}{newest} .. {symbol}{oldest}",
                    symbol = self.symbol
                )
            })?;
        // SAFETY: every kind's table begins with the plug-in's name, a
        // NUL-terminated string or null.
        let name_field = unsafe { *table.cast::<*const c_char>().as_ptr() };
        let plugin_name = if name_field.is_null() {
            self.file.to_string()
        } else {
            // SAFETY: as above, not null.
            unsafe { CStr::from_ptr(name_field) }
                .to_string_lossy()
                .into_owned()
        };
        Ok(Library {
            path: name.to_string(),
            version,
            name: plugin_name,
            table,
        })
    }

    fn info(&self, message: std::fmt::Arguments<'_>) {
        match self.subsystem {
            Subsystem::Init => tracing::info!(target: "INIT", "{message}"),
            Subsystem::InitTuning => tracing::info!(target: "INIT|TUNING", "{message}"),
            Subsystem::InitEnv => tracing::info!(target: "INIT|ENV", "{message}"),
        }
    }

    fn warn(&self, message: std::fmt::Arguments<'_>) {
        match self.subsystem {
            Subsystem::Init => tracing::warn!(target: "INIT", "{message}"),
            Subsystem::InitTuning => tracing::warn!(target: "INIT|TUNING", "{message}"),
            Subsystem::InitEnv => tracing::warn!(target: "INIT|ENV", "{message}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_names_follow_nccls_rules() {
        assert_eq!(library_names("env", None), ["libnccl-env.so"]);
        assert_eq!(library_names("env", Some(" ")), ["libnccl-env.so"]);
        assert_eq!(
            library_names("tuner", Some("x")),
            ["x", "libnccl-tuner-x.so"]
        );
        assert_eq!(library_names("env", Some("/p/a.so")), ["/p/a.so"]);
        assert_eq!(library_names("net", Some("libfoo.so")), ["libfoo.so"]);
        assert!(is_none(Some(" None ")));
        assert!(!is_none(None));
    }

    const TEST_KIND: Kind = Kind {
        file: "test",
        symbol: "rcclTestPlugin_v",
        interface: "rcclTest",
        versions: &[2, 1],
        subsystem: Subsystem::Init,
        without: "continuing without",
    };

    #[test]
    fn a_library_without_the_kinds_table_is_passed_over_by_name() {
        // The C library exports no table of this kind.
        let why = TEST_KIND.open("libc.so.6").unwrap_err();
        assert_eq!(
            why,
            "libc.so.6 exports none of rcclTestPlugin_v2 .. rcclTestPlugin_v1"
        );
        let mut tried = Vec::new();
        let names = ["/nonexistent/libnccl-test.so".to_string()];
        assert!(TEST_KIND.open_first(&names, &mut tried).is_none());
        assert!(
            tried[0].starts_with("/nonexistent/libnccl-test.so: "),
            "{tried:?}"
        );
        assert!(TEST_KIND.load(Some("none"), &names).is_none());
    }
}
