//! The built-in algorithms as a typed key: what the cost model's table of
//! forms ([`crate::estimate`]) and the replay's symmetry rules are keyed
//! by. Names (`NCCL_ALGO`, [`Algorithm::name`]) become a key once, at the
//! boundary, with [`Builtin::named`].

use rccl_algorithms::{Algorithm, Direct, HalvingDoubling, Hierarchical, OneShot, Ring, Tree};

/// A built-in algorithm of `rccl-algorithms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    Ring,
    Direct,
    Tree,
    HalvingDoubling,
    Hierarchical,
    OneShot,
}

impl Builtin {
    const ALL: [Builtin; 6] = [
        Builtin::Ring,
        Builtin::Direct,
        Builtin::Tree,
        Builtin::HalvingDoubling,
        Builtin::Hierarchical,
        Builtin::OneShot,
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
        assert_eq!(keyed, names);
        for name in names {
            let key = Builtin::named(name).expect("a key");
            assert_eq!(key.algorithm().name(), name);
        }
        assert_eq!(Builtin::named("RING"), None);
    }
}
