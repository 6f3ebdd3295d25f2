//! The built-in algorithms as a typed key: what the cost model's table of
//! forms ([`crate::estimate`]) and the replay's symmetry rules are keyed
//! by. Names (`NCCL_ALGO`, [`Algorithm::name`]) become a key once, at the
//! boundary, with [`Builtin::named`].

use rccl_algorithms::{
    Algorithm, Direct, HalvingDoubling, Hierarchical, OneShot, OrderedRing, Ring, Tree,
};

/// A built-in algorithm of `rccl-algorithms`: those the engine's tuner
/// ranks (`rccl_algorithms::builtins`), and the ordered ring, which its
/// deterministic mode runs in the ring's place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    Ring,
    Direct,
    Tree,
    HalvingDoubling,
    Hierarchical,
    OneShot,
    OrderedRing,
}

impl Builtin {
    const ALL: [Builtin; 7] = [
        Builtin::Ring,
        Builtin::Direct,
        Builtin::Tree,
        Builtin::HalvingDoubling,
        Builtin::Hierarchical,
        Builtin::OneShot,
        Builtin::OrderedRing,
    ];

    /// The algorithm it stands for.
    fn algorithm(self) -> &'static dyn Algorithm {
        match self {
            Builtin::Ring => &Ring,
            Builtin::Direct => &Direct,
            Builtin::Tree => &Tree,
            Builtin::HalvingDoubling => &HalvingDoubling,
            Builtin::Hierarchical => &Hierarchical,
            Builtin::OneShot => &OneShot,
            Builtin::OrderedRing => &OrderedRing,
        }
    }

    /// The built-in whose name is `name`, spelled as its
    /// [`Algorithm::name`] (a user's algorithm of the same name included),
    /// if any.
    pub(crate) fn named(name: &str) -> Option<Builtin> {
        Builtin::ALL
            .into_iter()
            .find(|b| b.algorithm().name() == name)
    }

    /// The algorithm a user's `name` stands for, in any case.
    pub(crate) fn algorithm_named(name: &str) -> Option<&'static dyn Algorithm> {
        Builtin::ALL
            .into_iter()
            .map(Builtin::algorithm)
            .find(|a| a.name().eq_ignore_ascii_case(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_algorithm_has_a_key() {
        let names: Vec<&str> = rccl_algorithms::builtins()
            .iter()
            .map(|a| a.name())
            .collect();
        let keyed: Vec<&str> = Builtin::ALL.iter().map(|b| b.algorithm().name()).collect();
        assert_eq!(keyed[..names.len()], names);
        assert_eq!(keyed[names.len()..], [OrderedRing.name()]);
        for name in keyed {
            let key = Builtin::named(name).expect("a key");
            assert_eq!(key.algorithm().name(), name);
        }
        assert_eq!(Builtin::named("RING"), None);
        assert_eq!(
            Builtin::algorithm_named("Ordered_Ring").map(|a| a.name()),
            Some("ordered_ring")
        );
    }
}
