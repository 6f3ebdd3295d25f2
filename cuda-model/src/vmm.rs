//! What the model keeps of virtual memory management (`cuMemCreate` and
//! its family, `api/virtual_memory.rs`): physical allocations, address
//! reservations and mappings.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::OwnedFd;

use cudarc::driver::sys::CUresult;

use crate::Res;

/// A physical allocation (`cuMemCreate` or an import).
pub(crate) struct Physical {
    pub memfd: OwnedFd,
    pub size: usize,
    pub dev: usize,
    pub handle_types: u32,
    /// Mappings of it that are not unmapped yet.
    pub mappings: usize,
    /// `cuMemRelease`d: the handle is gone; the memory lives on while
    /// mapped.
    pub released: bool,
}

pub(crate) struct Mapping {
    pub size: usize,
    pub handle: u64,
}

/// The model's VMM state, part of its `State`.
#[derive(Default)]
pub(crate) struct Vmm {
    pub physicals: HashMap<u64, Physical>,
    /// Address reservations: base to size.
    pub reservations: BTreeMap<u64, usize>,
    /// Mappings: base to mapping.
    pub mappings: BTreeMap<u64, Mapping>,
}

impl Vmm {
    /// Whether `ptr` lies in an address reservation.
    pub fn reserves(&self, ptr: u64) -> bool {
        self.reservations
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, &size)| ptr < base + size as u64)
    }

    /// The bases of the mappings that make up `[ptr, ptr + size)` exactly,
    /// one after another, or `None`.
    pub fn covering(&self, ptr: u64, size: usize) -> Option<Vec<u64>> {
        let end = ptr.checked_add(size as u64)?;
        let mut bases = Vec::new();
        let mut at = ptr;
        while at < end {
            let m = self.mappings.get(&at)?;
            bases.push(at);
            at += m.size as u64;
        }
        (at == end && !bases.is_empty()).then_some(bases)
    }

    /// The physical allocation `handle` names, not released.
    pub fn live(&self, handle: u64) -> Res<&Physical> {
        self.physicals
            .get(&handle)
            .filter(|p| !p.released)
            .ok_or(CUresult::CUDA_ERROR_INVALID_VALUE)
    }
}
