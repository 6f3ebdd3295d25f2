//! The tuner: which algorithm, which protocol, how many channels and what
//! chunk size each operation gets, and NCCL's `NCCL_ALGO` / `NCCL_PROTO`
//! syntax that narrows its choice.

use rccl_algorithms::{Algorithm, CollKind, CollSpec, Params, Topology};
use rccl_transports::Protocol;

use crate::config::{Config, FIFO_SLOTS};
use crate::error::{Error, Result};

/// Bytes per channel below which adding a channel does not pay: each
/// channel's connection and pipeline have a fixed cost.
const BYTES_PER_CHANNEL: usize = 512 << 10;

/// Largest call (bytes per rank) the LL protocol is picked for.
const LL_MAX_BYTES: usize = 16 << 10;
/// Largest call the LL128 protocol is picked for.
const LL128_MAX_BYTES: usize = 256 << 10;

/// A user's narrowing of a choice, in NCCL's syntax: a comma list of names
/// allows those names; a leading `^` excludes them instead; entries
/// separated by `;` may apply to one collective (`allreduce:tree;^ll`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Selection {
    text: String,
    rules: Vec<Rule>,
}

impl std::fmt::Display for Selection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Rule {
    /// The collective it applies to (lower case NCCL name), or all.
    collective: Option<String>,
    exclude: bool,
    names: Vec<String>,
}

impl Selection {
    /// Parses `text`, the value of `variable` (named in errors).
    pub fn parse(variable: &str, text: &str) -> Result<Selection> {
        let mut rules = Vec::new();
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (collective, list) = match entry.split_once(':') {
                Some((coll, list)) => {
                    let coll = coll.trim().to_ascii_lowercase();
                    if !CollKind::ALL
                        .iter()
                        .any(|k| k.name().eq_ignore_ascii_case(&coll))
                    {
                        return Err(Error::InvalidArgument(format!(
                            "{variable}={text:?}: unknown collective {coll:?}"
                        )));
                    }
                    (Some(coll), list.trim())
                }
                None => (None, entry),
            };
            let (exclude, list) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let names: Vec<String> = list
                .split(',')
                .map(|n| n.trim().to_ascii_lowercase())
                .filter(|n| !n.is_empty())
                .collect();
            if names.is_empty() {
                return Err(Error::InvalidArgument(format!(
                    "{variable}={text:?}: an entry names nothing"
                )));
            }
            rules.push(Rule {
                collective,
                exclude,
                names,
            });
        }
        Ok(Selection {
            text: text.to_string(),
            rules,
        })
    }

    /// Every name the selection mentions.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.rules
            .iter()
            .flat_map(|r| r.names.iter().map(String::as_str))
    }

    /// Whether `name` may be used for `kind`. The rule for the collective
    /// wins over a rule for all; without a rule everything is allowed.
    pub fn allows(&self, kind: CollKind, name: &str) -> bool {
        let for_kind = self
            .rules
            .iter()
            .find(|r| {
                r.collective
                    .as_deref()
                    .is_some_and(|c| kind.name().eq_ignore_ascii_case(c))
            })
            .or_else(|| self.rules.iter().find(|r| r.collective.is_none()));
        match for_kind {
            None => true,
            Some(rule) => rule.names.iter().any(|n| n.eq_ignore_ascii_case(name)) != rule.exclude,
        }
    }
}

/// What the tuner picked for one operation.
pub struct Choice {
    /// The algorithm whose schedule runs.
    pub algorithm: &'static dyn Algorithm,
    /// The protocol its pieces travel with.
    pub protocol: Protocol,
    /// Channels and chunking.
    pub params: Params,
}

/// Where an operation runs: what the tuner needs to know beyond the call.
pub struct Placement<'a> {
    /// Whether every peer is reached through shared memory (network
    /// connections carry every protocol as Simple, so the lighter protocols
    /// only pay within a host).
    pub all_shm: bool,
    /// Which ranks share a host.
    pub topology: &'a Topology,
    /// Whether the call is in place (some algorithms need separate
    /// buffers).
    pub in_place: bool,
}

/// Picks algorithm, protocol and parameters for `spec` with
/// `elem_size`-byte elements.
pub fn choose(
    config: &Config,
    spec: &CollSpec,
    elem_size: usize,
    placement: &Placement<'_>,
) -> Result<Choice> {
    let bytes = spec.count * elem_size;
    let protocol = choose_protocol(config, spec.kind, bytes, placement.all_shm)?;
    let algorithm = choose_algorithm(config, spec.kind, placement)?;
    Ok(Choice {
        algorithm,
        protocol,
        params: Params {
            nchannels: channels_for(config, bytes),
            chunk_elems: (chunk_bytes(config, protocol) / elem_size).max(1),
        },
    })
}

fn choose_protocol(
    config: &Config,
    kind: CollKind,
    bytes: usize,
    all_shm: bool,
) -> Result<Protocol> {
    let preferred = if !all_shm {
        [Protocol::Simple, Protocol::Ll128, Protocol::Ll]
    } else if bytes <= LL_MAX_BYTES {
        [Protocol::Ll, Protocol::Ll128, Protocol::Simple]
    } else if bytes <= LL128_MAX_BYTES {
        [Protocol::Ll128, Protocol::Simple, Protocol::Ll]
    } else {
        [Protocol::Simple, Protocol::Ll128, Protocol::Ll]
    };
    preferred
        .into_iter()
        .find(|p| config.proto.allows(kind, p.name()))
        .ok_or_else(|| {
            Error::InvalidUsage(format!("NCCL_PROTO leaves no protocol for {}", kind.name()))
        })
}

fn choose_algorithm(
    config: &Config,
    kind: CollKind,
    placement: &Placement<'_>,
) -> Result<&'static dyn Algorithm> {
    let fits = |a: &&'static dyn Algorithm| {
        a.supports(kind)
            && a.supports_topology(placement.topology)
            && (!placement.in_place || a.supports_in_place(kind))
            && config.algo.allows(kind, a.name())
    };
    let default = rccl_algorithms::default_for(kind);
    if fits(&default) {
        return Ok(default);
    }
    rccl_algorithms::builtins()
        .iter()
        .copied()
        .find(fits)
        .ok_or_else(|| {
            Error::InvalidUsage(format!(
                "NCCL_ALGO=\"{}\" leaves no algorithm that implements {}{} on this placement",
                config.algo,
                kind.name(),
                if placement.in_place { " in place" } else { "" }
            ))
        })
}

/// Channels and protocol for a batch of sends and receives whose largest
/// message is `bytes` long.
pub fn p2p_choice(config: &Config, bytes: usize) -> (usize, Protocol) {
    (channels_for(config, bytes), Protocol::Simple)
}

fn channels_for(config: &Config, bytes: usize) -> usize {
    (bytes / BYTES_PER_CHANNEL).clamp(config.min_channels, config.max_channels)
}

/// The pipeline chunk for `protocol`: half a connection's FIFO, so a
/// sender can fill one chunk while the receiver drains the previous one
/// (and every chunk fits the FIFO, which the schedules' deadlock freedom
/// relies on).
pub fn chunk_bytes(config: &Config, protocol: Protocol) -> usize {
    config.slot_bytes(protocol) * FIFO_SLOTS / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_follow_nccl_syntax() {
        let plain = Selection::parse("NCCL_PROTO", "LL,Simple").unwrap();
        assert!(plain.allows(CollKind::AllReduce, "ll"));
        assert!(!plain.allows(CollKind::AllReduce, "LL128"));
        let excluded = Selection::parse("NCCL_PROTO", "^LL").unwrap();
        assert!(!excluded.allows(CollKind::Broadcast, "LL"));
        assert!(excluded.allows(CollKind::Broadcast, "Simple"));
        let per = Selection::parse("NCCL_ALGO", "allreduce:tree;^ring").unwrap();
        assert!(per.allows(CollKind::AllReduce, "tree"));
        assert!(!per.allows(CollKind::AllReduce, "ring"));
        assert!(!per.allows(CollKind::AllGather, "ring"));
        assert!(per.allows(CollKind::AllGather, "direct"));
        assert!(Selection::default().allows(CollKind::Reduce, "anything"));
        assert!(Selection::parse("NCCL_ALGO", "nosuchcoll:ring").is_err());
        assert!(Selection::parse("NCCL_ALGO", "^").is_err());
    }

    #[test]
    fn the_protocol_follows_size_and_transport_unless_overridden() {
        let config = Config::default();
        let pick = |bytes, shm| choose_protocol(&config, CollKind::AllReduce, bytes, shm).unwrap();
        assert_eq!(pick(8, true), Protocol::Ll);
        assert_eq!(pick(64 << 10, true), Protocol::Ll128);
        assert_eq!(pick(16 << 20, true), Protocol::Simple);
        assert_eq!(pick(8, false), Protocol::Simple);
        let forced = Config {
            proto: Selection::parse("NCCL_PROTO", "LL128").unwrap(),
            ..Config::default()
        };
        assert_eq!(
            choose_protocol(&forced, CollKind::AllReduce, 8, true).unwrap(),
            Protocol::Ll128
        );
        let none = Config {
            proto: Selection::parse("NCCL_PROTO", "^LL,LL128,Simple").unwrap(),
            ..Config::default()
        };
        assert!(choose_protocol(&none, CollKind::AllReduce, 8, true).is_err());
    }
}
