//! What a block holds of a modeled SM, and how many blocks of a kernel fit
//! on one: the limits of compute capability 9.0 (the capability the model
//! reports), from the CUDA programming guide's table of them. Occupancy
//! (`cuOccupancyMaxActiveBlocksPerMultiprocessor`) and residency (a
//! running block waits for an SM with room) both count from here, so a
//! grid the occupancy figure admits is resident at once.
//!
//! Where the hardware leaves a choice the model takes the stricter one:
//! a kernel is taken to use every register its launch bound allows (the
//! model runs the host twin and knows no compiler's count), and each block
//! holds the shared memory CUDA reserves for the system besides its own.

/// Threads resident on one SM.
pub(crate) const THREADS_PER_SM: u32 = 2048;
/// Blocks resident on one SM.
pub(crate) const BLOCKS_PER_SM: u32 = 32;
/// 32-bit registers of one SM (and at most of one block).
pub(crate) const REGISTERS_PER_SM: u32 = 64 << 10;
/// Shared memory of one SM, in bytes.
pub(crate) const SHARED_PER_SM: usize = 228 << 10;
/// Shared memory a block may take without opting in, static and dynamic
/// together (`cuFuncSetAttribute`, which the model does not offer).
pub(crate) const SHARED_PER_BLOCK: usize = 48 << 10;
/// Shared memory CUDA reserves for itself in every block.
pub(crate) const RESERVED_SHARED_PER_BLOCK: usize = 1 << 10;
const SHARED_GRANULE: usize = 128;
const WARP: u32 = 32;
/// Registers are given to a warp in units of this many.
const REGISTER_GRANULE: u32 = 256;
const MAX_REGISTERS_PER_THREAD: u32 = 255;

/// What one resident block of a launch holds of its SM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockNeeds {
    /// Threads, whole warps.
    pub threads: u32,
    pub registers: u32,
    /// Shared memory in bytes: static, dynamic and reserved.
    pub shared: usize,
}

/// What a block of `threads` threads and `dynamic_shared` bytes of
/// dynamic shared memory holds, of a kernel whose launch bound is `bound`
/// threads and whose static shared memory is `static_shared` bytes;
/// `None` when such a block cannot run at all (more threads than the
/// bound, more shared memory than a block may take).
pub(crate) fn block_needs(
    bound: u32,
    static_shared: usize,
    threads: u32,
    dynamic_shared: usize,
) -> Option<BlockNeeds> {
    if threads == 0 || threads > bound {
        return None;
    }
    let own_shared = static_shared.checked_add(dynamic_shared)?;
    if own_shared > SHARED_PER_BLOCK {
        return None;
    }
    let warps = threads.div_ceil(WARP);
    Some(BlockNeeds {
        threads: warps * WARP,
        registers: warps * (registers_per_thread(bound) * WARP).next_multiple_of(REGISTER_GRANULE),
        shared: own_shared.next_multiple_of(SHARED_GRANULE) + RESERVED_SHARED_PER_BLOCK,
    })
}

/// The registers per thread of a kernel whose launch bound is `bound`
/// threads: the most a compiler may give it, so that a block of `bound`
/// threads still fits on an SM.
fn registers_per_thread(bound: u32) -> u32 {
    let warps = bound.div_ceil(WARP);
    let per_warp = REGISTERS_PER_SM / warps / REGISTER_GRANULE * REGISTER_GRANULE;
    (per_warp / WARP).min(MAX_REGISTERS_PER_THREAD)
}

/// How many blocks of `needs` one empty SM holds at once.
pub(crate) fn blocks_per_sm(needs: BlockNeeds) -> u32 {
    let by_shared = u32::try_from(SHARED_PER_SM / needs.shared).unwrap_or(u32::MAX);
    BLOCKS_PER_SM
        .min(THREADS_PER_SM / needs.threads)
        .min(REGISTERS_PER_SM / needs.registers)
        .min(by_shared)
}

/// What the blocks resident on one SM hold now.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SmLoad {
    blocks: u32,
    threads: u32,
    registers: u32,
    shared: usize,
}

impl SmLoad {
    /// Whether a block of `needs` fits beside the blocks resident now.
    pub(crate) fn has_room(&self, needs: BlockNeeds) -> bool {
        self.blocks < BLOCKS_PER_SM
            && self.threads + needs.threads <= THREADS_PER_SM
            && self.registers + needs.registers <= REGISTERS_PER_SM
            && self.shared + needs.shared <= SHARED_PER_SM
    }

    pub(crate) fn take(&mut self, needs: BlockNeeds) {
        self.blocks += 1;
        self.threads += needs.threads;
        self.registers += needs.registers;
        self.shared += needs.shared;
    }

    pub(crate) fn release(&mut self, needs: BlockNeeds) {
        self.blocks -= 1;
        self.threads -= needs.threads;
        self.registers -= needs.registers;
        self.shared -= needs.shared;
    }
}
