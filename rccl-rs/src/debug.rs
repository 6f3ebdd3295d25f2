//! Logging with NCCL's switches: `NCCL_DEBUG=WARN|INFO|TRACE` sets the
//! level, `NCCL_DEBUG_SUBSYS` (`INIT,GRAPH,TUNING,COLL,NET,SHM,P2P,
//! BOOTSTRAP,ENV,ALLOC`, `ALL`, or `^` to exclude) the subsystems, and every line
//! reads `host:pid:tid [rank] NCCL INFO ...` as NCCL users expect.
//!
//! Events are `tracing` events whose target names the subsystem, or
//! several joined by `|` (printed when any of them is enabled, as NCCL's
//! `INFO(NCCL_INIT|NCCL_P2P, ...)`); when
//! `NCCL_DEBUG` is set and the application has not installed a subscriber
//! of its own, the first communicator installs one that prints them to
//! standard error.

use std::fmt;
use std::sync::Once;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Subsystems, as event targets.
pub const INIT: &str = "INIT";
/// Topology, rings and trees.
pub const GRAPH: &str = "GRAPH";
/// Algorithm, protocol and channel choices.
pub const TUNING: &str = "TUNING";
/// Collective calls.
pub const COLL: &str = "COLL";
/// Network connections.
pub const NET: &str = "NET";
/// What a communicator allocates and frees (`crate::memory`).
pub const ALLOC: &str = "ALLOC";
/// Connection lines (`Channel 00 : 0 -> 1 via ...`) print, as NCCL's,
/// under INIT and their transport's subsystem: these targets.
pub const INIT_NET: &str = "INIT|NET";
/// See [`INIT_NET`].
pub const INIT_P2P: &str = "INIT|P2P";
/// See [`INIT_NET`].
pub const INIT_SHM: &str = "INIT|SHM";

/// The subsystems NCCL enables by default.
const DEFAULT_SUBSYS: &str = "INIT,BOOTSTRAP,ENV";

static INSTALL: Once = Once::new();

/// Installs the NCCL-style log printer once, if `NCCL_DEBUG` asks for it.
pub fn init() {
    INSTALL.call_once(|| {
        let Some(level) = rccl_env::var("NCCL_DEBUG") else {
            return;
        };
        let level = match level.to_ascii_uppercase().as_str() {
            "VERSION" | "WARN" => Level::WARN,
            "INFO" => Level::INFO,
            "TRACE" => Level::TRACE,
            _ => return,
        };
        let subsys = rccl_env::var("NCCL_DEBUG_SUBSYS").unwrap_or_else(|| DEFAULT_SUBSYS.into());
        let filter = SubsysFilter::parse(&subsys);
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .event_format(NcclFormat)
            .finish();
        use tracing_subscriber::layer::SubscriberExt;
        let subscriber = subscriber.with(tracing_subscriber::filter::filter_fn(move |meta| {
            *meta.level() <= Level::WARN || filter.allows(meta.target())
        }));
        // An application with its own subscriber keeps it.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

/// Which subsystems print (warnings always do).
struct SubsysFilter {
    exclude: bool,
    names: Vec<String>,
}

impl SubsysFilter {
    fn parse(text: &str) -> SubsysFilter {
        let (exclude, list) = match text.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        SubsysFilter {
            exclude,
            names: list
                .split(',')
                .map(|s| s.trim().to_ascii_uppercase())
                .collect(),
        }
    }

    /// Whether an event of `target` prints: any of its subsystems is
    /// enabled.
    fn allows(&self, target: &str) -> bool {
        subsystem_of(target).split('|').any(|subsys| {
            let listed = self.names.iter().any(|n| n == "ALL" || n == subsys);
            listed != self.exclude
        })
    }
}

/// The subsystem of an event target: our own targets name it; events of
/// the transports and bootstrap modules map to NET and BOOTSTRAP.
fn subsystem_of(target: &str) -> &str {
    if target.contains("bootstrap") {
        "BOOTSTRAP"
    } else if target.starts_with("rccl_transports") {
        "NET"
    } else {
        target
    }
}

/// `host:pid:tid [rank] NCCL INFO message`.
struct NcclFormat;

impl<S, N> FormatEvent<S, N> for NcclFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR | Level::WARN => "WARN",
            Level::INFO => "INFO",
            _ => "TRACE",
        };
        write!(
            writer,
            "{}:{}:{} NCCL {level} ",
            host(),
            std::process::id(),
            thread_id()
        )?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

fn host() -> &'static str {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(crate::net::hostname)
}

fn thread_id() -> i64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subsystem_filters_follow_nccl_syntax() {
        let some = SubsysFilter::parse("INIT,COLL");
        assert!(some.allows(INIT) && some.allows(COLL) && !some.allows(NET));
        let all_but = SubsysFilter::parse("^NET");
        assert!(all_but.allows(INIT) && !all_but.allows("rccl_transports::auth_tcp"));
        assert!(SubsysFilter::parse("ALL").allows(TUNING));
        assert!(SubsysFilter::parse(DEFAULT_SUBSYS).allows("rccl::bootstrap"));
    }

    #[test]
    fn connection_lines_print_under_init_or_their_transport() {
        for enabled in ["INIT,P2P", "INIT", "P2P", "ALL", "^NET"] {
            assert!(SubsysFilter::parse(enabled).allows(INIT_P2P), "{enabled}");
        }
        for disabled in ["SHM", "NET,COLL", "^INIT,P2P"] {
            assert!(
                !SubsysFilter::parse(disabled).allows(INIT_P2P),
                "{disabled}"
            );
        }
        assert!(SubsysFilter::parse("SHM").allows(INIT_SHM));
        assert!(!SubsysFilter::parse("P2P").allows(INIT_NET));
    }
}
