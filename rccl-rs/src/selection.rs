//! NCCL's `NCCL_ALGO` / `NCCL_PROTO` syntax: which algorithms and
//! protocols the user allows, per collective. The settings hold one of
//! each (`Config::algo`, `Config::proto`); the tuner asks them what it may
//! pick.

use rccl_algorithms::CollKind;

use crate::error::{Error, Result};

/// A user's narrowing of a choice, in NCCL's syntax (`NCCL_ALGO`,
/// `NCCL_PROTO`): entries separated by `;`, each a comma list of names,
/// any case. A list allows the names it holds; a leading `^` excludes them
/// instead (it applies to the whole list: `^ring,tree` excludes both). An
/// entry prefixed with a collective and `:` applies to that collective
/// only; only the first entry may lack the prefix, and it applies to every
/// collective. A collective's last entry replaces what came before:
/// `^ring;allreduce:tree` allows tree alone for all-reduce and everything
/// but ring elsewhere. `^` alone excludes nothing.
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
    /// The collective it applies to, or every collective.
    collective: Option<CollKind>,
    exclude: bool,
    /// As written (they compare in any case).
    names: Vec<String>,
}

impl Selection {
    /// Parses `text`, the value of `variable` (named in errors). Which
    /// names are known is checked apart ([`Selection::check_names`]), as
    /// algorithms may be registered after the settings are read.
    pub fn parse(variable: &str, text: &str) -> Result<Selection> {
        let invalid = |what: String| Error::InvalidArgument(format!("{variable}={text:?}: {what}"));
        let mut rules = Vec::new();
        let entries = text.split(';').map(str::trim).filter(|e| !e.is_empty());
        for (index, entry) in entries.enumerate() {
            let (collective, list) = match entry.split_once(':') {
                Some((coll, list)) => {
                    let coll = coll.trim();
                    let kind = CollKind::ALL
                        .into_iter()
                        .find(|k| k.name().eq_ignore_ascii_case(coll))
                        .ok_or_else(|| {
                            invalid(format!(
                                "unknown collective {coll:?} (known: {})",
                                CollKind::ALL.map(CollKind::name).join(", ")
                            ))
                        })?;
                    (Some(kind), list.trim())
                }
                None if index == 0 => (None, entry),
                None => {
                    return Err(invalid(format!(
                        "{entry:?} names no collective; only the first entry may apply to every \
                         collective (write it first, or as collective:{entry})"
                    )))
                }
            };
            let (exclude, list) = match list.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let names: Vec<String> = list
                .split(',')
                .map(|n| n.trim().to_string())
                .filter(|n| !n.is_empty())
                .collect();
            if let Some(name) = names.iter().find(|n| n.starts_with('^')) {
                return Err(invalid(format!(
                    "{name:?}: '^' may only start a list, and excludes the whole list \
                     (^ring,tree excludes ring and tree)"
                )));
            }
            if names.is_empty() && !exclude {
                return Err(invalid(format!("{entry:?} names nothing")));
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

    /// Refuses a name that is not in `known` (any case) or `accepted`,
    /// naming it and the known ones; `variable` and `what` ("protocol",
    /// "algorithm") word the error.
    pub fn check_names(
        &self,
        variable: &str,
        what: &str,
        known: &[&str],
        accepted: &[&str],
    ) -> Result<()> {
        let is_known = |name: &str| {
            known
                .iter()
                .chain(accepted)
                .any(|k| k.eq_ignore_ascii_case(name))
        };
        match self
            .rules
            .iter()
            .flat_map(|r| &r.names)
            .find(|n| !is_known(n))
        {
            None => Ok(()),
            Some(name) => Err(Error::InvalidArgument(format!(
                "{variable}={:?}: unknown {what} {name:?} (known: {})",
                self.text,
                known.join(", ")
            ))),
        }
    }

    /// Whether `name` may be used for `kind`: the last entry that applies
    /// to `kind` decides; without one everything is allowed.
    pub fn allows(&self, kind: CollKind, name: &str) -> bool {
        match self
            .rules
            .iter()
            .rev()
            .find(|r| r.collective.is_none_or(|c| c == kind))
        {
            None => true,
            Some(rule) => rule.names.iter().any(|n| n.eq_ignore_ascii_case(name)) != rule.exclude,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Selection {
        Selection::parse("NCCL_ALGO", text).unwrap()
    }

    fn refused(text: &str) -> String {
        let err = Selection::parse("NCCL_ALGO", text).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
        err.to_string()
    }

    #[test]
    fn lists_allow_and_a_leading_caret_excludes_the_whole_list() {
        let plain = Selection::parse("NCCL_PROTO", "LL,Simple").unwrap();
        assert!(plain.allows(CollKind::AllReduce, "ll"));
        assert!(plain.allows(CollKind::AllReduce, "SIMPLE"));
        assert!(!plain.allows(CollKind::AllReduce, "LL128"));
        let excluded = Selection::parse("NCCL_PROTO", "^LL").unwrap();
        assert!(!excluded.allows(CollKind::Broadcast, "LL"));
        assert!(excluded.allows(CollKind::Broadcast, "Simple"));
        let both = parse("^Ring,TREE");
        assert!(!both.allows(CollKind::AllReduce, "ring"));
        assert!(!both.allows(CollKind::AllReduce, "tree"));
        assert!(both.allows(CollKind::AllReduce, "rhd"));
        // Empty entries and names are skipped, as NCCL's tokenizer does.
        let sparse = parse(" ring,, tree ;;");
        assert!(sparse.allows(CollKind::AllReduce, "tree"));
        assert!(!sparse.allows(CollKind::AllReduce, "rhd"));
        // Nothing set, an empty value, or a bare '^' exclude nothing.
        for open in [Selection::default(), parse(""), parse("^")] {
            assert!(open.allows(CollKind::Reduce, "anything"));
        }
    }

    #[test]
    fn per_collective_entries_replace_the_first_for_their_collective() {
        let per = parse("^ring;allreduce:tree");
        assert!(per.allows(CollKind::AllReduce, "tree"));
        assert!(!per.allows(CollKind::AllReduce, "rhd"));
        assert!(!per.allows(CollKind::AllGather, "ring"));
        assert!(per.allows(CollKind::AllGather, "hier"));
        // NCCL's own examples (tuning.cc).
        let nccl = Selection::parse("NCCL_PROTO", "LL,Simple;allreduce:^LL").unwrap();
        assert!(nccl.allows(CollKind::AllReduce, "LL128"));
        assert!(!nccl.allows(CollKind::AllReduce, "LL"));
        assert!(!nccl.allows(CollKind::Broadcast, "LL128"));
        let nccl = Selection::parse("NCCL_PROTO", "^LL128;allreduce:LL128").unwrap();
        assert!(nccl.allows(CollKind::AllReduce, "LL128"));
        assert!(!nccl.allows(CollKind::AllReduce, "Simple"));
        assert!(nccl.allows(CollKind::Reduce, "Simple"));
        assert!(!nccl.allows(CollKind::Reduce, "LL128"));
        // Collectives any case; the last entry for one wins.
        let later = parse("AllReduce:ring;broadcast:tree;ALLREDUCE:rhd");
        assert!(later.allows(CollKind::AllReduce, "rhd"));
        assert!(!later.allows(CollKind::AllReduce, "ring"));
        assert!(later.allows(CollKind::Broadcast, "tree"));
        assert!(later.allows(CollKind::Scatter, "direct"));
        assert!(parse("alltoall:direct").allows(CollKind::AllToAll, "direct"));
    }

    #[test]
    fn malformed_selections_are_refused_naming_what_is_wrong() {
        let err = refused("nosuchcoll:ring");
        assert!(err.contains("unknown collective \"nosuchcoll\""), "{err}");
        assert!(err.contains("AllReduce"), "{err}");
        // NCCL: "All entries except the first must have a prefix".
        let err = refused("allreduce:tree;^ring");
        assert!(err.contains("\"^ring\" names no collective"), "{err}");
        // NCCL: "Unrecognized element token \"^tree\"".
        let err = refused("^ring,^tree");
        assert!(
            err.contains("\"^tree\"") && err.contains("may only start"),
            "{err}"
        );
        let err = refused("allreduce:");
        assert!(err.contains("names nothing"), "{err}");
    }

    #[test]
    fn unknown_names_are_refused_with_the_known_ones() {
        let known = ["ring", "tree"];
        let check =
            |text: &str| parse(text).check_names("NCCL_ALGO", "algorithm", &known, &["nvls"]);
        assert_eq!(check("RING,tree;broadcast:^Ring"), Ok(()));
        assert_eq!(check("^NVLS"), Ok(()));
        let err = check("ring,bogus").unwrap_err();
        assert_eq!(
            err,
            Error::InvalidArgument(
                "NCCL_ALGO=\"ring,bogus\": unknown algorithm \"bogus\" (known: ring, tree)".into()
            )
        );
        let err = check("allreduce:^ring,hier").unwrap_err().to_string();
        assert!(err.contains("\"hier\""), "{err}");
        let err = check("allreduce:ring:tree").unwrap_err().to_string();
        assert!(err.contains("\"ring:tree\""), "{err}");
    }
}
