//! The tuner's choices a communicator remembers per call shape.

use super::CommInner;
use crate::error::Result;

/// Tuner choices remembered per call shape: a training loop repeats the
/// same few calls, and choosing costs more than the smallest call itself.
#[derive(Default)]
pub(crate) struct ChoiceCache {
    /// The tuner generation the entries were made under.
    generation: u64,
    entries: Vec<(ChoiceKey, crate::tuning::Choice)>,
    /// The entry replaced next once the cache is full.
    next_victim: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct ChoiceKey {
    kind: rccl_algorithms::CollKind,
    count: usize,
    elem_size: usize,
    root: usize,
    in_place: bool,
}

/// Call shapes a communicator remembers the choice for.
const CHOICE_CACHE_ENTRIES: usize = 16;

impl CommInner {
    /// What the tuner picks for a collective call, remembered per call
    /// shape (while no tuner plug-in is installed).
    pub fn choose(
        &self,
        spec: &rccl_algorithms::CollSpec,
        elem_size: usize,
        in_place: bool,
    ) -> Result<crate::tuning::Choice> {
        let key = ChoiceKey {
            kind: spec.kind,
            count: spec.count,
            elem_size,
            root: spec.root,
            in_place,
        };
        let generation = crate::tuning::generation();
        let cacheable = !crate::tuning::has_plugin();
        if cacheable {
            let cache = self.choices.lock();
            if cache.generation == generation {
                if let Some((_, choice)) = cache.entries.iter().find(|(k, _)| *k == key) {
                    return Ok(*choice);
                }
            }
        }
        let choice = crate::tuning::choose(
            &self.config,
            spec,
            elem_size,
            &crate::tuning::Placement {
                all_shm: self.all_shm,
                topology: &self.topology,
                in_place,
                board_bytes: self.board_bytes(),
                model: &self.link_model,
                rails: self.rails,
                tuner: self
                    .tuner
                    .as_ref()
                    .map(|t| t as &dyn crate::tuning::TunerPlugin),
            },
        )?;
        if cacheable {
            let mut cache = self.choices.lock();
            if cache.generation != generation {
                *cache = ChoiceCache {
                    generation,
                    ..ChoiceCache::default()
                };
            }
            if cache.entries.len() < CHOICE_CACHE_ENTRIES {
                cache.entries.push((key, choice));
            } else {
                let victim = cache.next_victim;
                cache.entries[victim] = (key, choice);
                cache.next_victim = (victim + 1) % CHOICE_CACHE_ENTRIES;
            }
        }
        Ok(choice)
    }
}
