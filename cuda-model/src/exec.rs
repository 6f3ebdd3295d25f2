//! What streams and graphs run: memsets, copies, host functions, event
//! records, frees, and kernels of the fatbin as their host twin, each
//! block holding its part of a modeled SM while it runs.

use std::ffi::c_void;

use cudarc::driver::sys::CUresult;
use parking_lot::{Condvar, Mutex};
use rccl_device::abi::ReduceArgs;
use rccl_device::twin::{self, ChannelEnd};
use rccl_device::work::{WorkBlock, WorkHeader, PEER_ENDS_BYTES, WORK_LOCAL_BYTES};

use crate::state::{lock, notify, wait_until};
use crate::work::{Kernel, Node, Work};
use crate::{as_host_function, report, Res};

/// A kernel of the fatbin as the model knows it.
pub(crate) struct KernelSpec {
    pub name: &'static str,
    /// The size of each parameter.
    pub params: &'static [usize],
    /// The launch bound: threads per block at most.
    pub bound: u32,
    /// Bytes of static shared memory a block holds (`__shared__` in
    /// device/kernels/kernels.cu).
    pub static_shared: usize,
}

/// Every kernel of the fatbin is bound to 512 threads per block.
const fn kernel(name: &'static str, params: &'static [usize], static_shared: usize) -> KernelSpec {
    KernelSpec {
        name,
        params,
        bound: 512,
        static_shared,
    }
}

/// The fatbin's kernels.
const KERNELS: [KernelSpec; 15] = [
    kernel("rccl_reduce_int8", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_uint8", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_int32", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_uint32", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_int64", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_uint64", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_float16", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_float32", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_float64", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_bfloat16", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_float8e4m3", &[REDUCE_ARGS], 0),
    kernel("rccl_reduce_float8e5m2", &[REDUCE_ARGS], 0),
    kernel("rccl_copy", &[8, 8, 8], 0),
    // One FIFO end.
    kernel("rccl_fifo_loopback", &[LOOPBACK_ARGS], PEER_ENDS_BYTES / 2),
    // The block's descriptors (`WorkLocal` and its `WorkBlock`).
    kernel(
        "rccl_run_work",
        &[8, 8],
        WORK_LOCAL_BYTES + size_of::<WorkBlock>(),
    ),
];

/// The fatbin's kernel named `name`.
pub(crate) fn kernel_spec(name: &str) -> Option<&'static KernelSpec> {
    KERNELS.iter().find(|k| k.name == name)
}

const REDUCE_ARGS: usize = std::mem::size_of::<ReduceArgs>();
const LOOPBACK_ARGS: usize = std::mem::size_of::<rccl_device::abi::LoopbackArgs>();

/// Bytes per element, by `ncclDataType_t`: how far a reduction reaches.
const ELEMENT_BYTES: [u64; 12] = [1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1];

/// Runs `work` for device `dev` (on a stream's worker or a graph's node).
pub(crate) fn run(work: &Work, dev: usize) -> Res<()> {
    match work {
        Work::Kernel(k) => run_kernel(k),
        &Work::Memset {
            dst,
            value,
            elem,
            count,
        } => {
            for i in 0..count {
                let at = (dst as usize + i * elem) as *mut u8;
                // SAFETY: the call checked that the range lies in one
                // allocation, which the program keeps until the memset
                // ran (using it after a free is its bug, as on a GPU).
                unsafe {
                    std::ptr::copy_nonoverlapping(value.to_le_bytes().as_ptr(), at, elem);
                }
            }
            Ok(())
        }
        &Work::Copy { dst, src, bytes } => {
            // SAFETY: as for the memset, both ranges.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
            Ok(())
        }
        Work::Staged { dst, data } => {
            // SAFETY: as for the memset; `data` is the staged source.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), *dst as *mut u8, data.len()) };
            Ok(())
        }
        &Work::Host { f, arg } => {
            // One host function of the context at a time: CUDA may run
            // those of independent streams one after another.
            let mut st = lock();
            wait_until(
                &mut st,
                || {
                    format!(
                        "a host function on device {dev} waits for another host function of the \
                         context to return (CUDA may run them one at a time)"
                    )
                },
                |s| !s.devices[dev].host_busy,
            )?;
            st.devices[dev].host_busy = true;
            drop(st);
            as_host_function(|| {
                // SAFETY: the program's host function with the argument
                // it gave, as the driver calls it.
                unsafe { f(arg as *mut c_void) }
            });
            lock().devices[dev].host_busy = false;
            notify();
            Ok(())
        }
        &Work::WaitEvent(event) => {
            let mut st = lock();
            let Some((stream, seq)) = st.events.get(&event).and_then(|e| e.target) else {
                return Ok(());
            };
            wait_until(
                &mut st,
                || format!("an external event wait node on device {dev}"),
                |s| s.reached(stream, seq) || s.devices[dev].sticky.is_some(),
            )
        }
        &Work::WaitValue { addr, value, flags } => wait_value(addr, value, flags, dev),
        &Work::Record(event) => {
            if let Some(e) = lock().events.get_mut(&event) {
                e.time = Some(std::time::Instant::now());
            }
            Ok(())
        }
        &Work::Free(ptr) => {
            lock().release(ptr);
            Ok(())
        }
        Work::Graph { nodes, .. } => run_graph(nodes, dev),
        Work::Empty => Ok(()),
        &Work::Pause(d) => {
            std::thread::sleep(d);
            Ok(())
        }
    }
}

/// `CU_STREAM_WAIT_VALUE_GEQ`, `_EQ`, `_AND`, `_NOR`.
pub(crate) const WAIT_CONDITIONS: u32 = 3;
/// `CU_STREAM_WAIT_VALUE_FLUSH`.
pub(crate) const WAIT_FLUSH: u32 = 1 << 30;

/// Whether `word` meets `cuStreamWaitValue32`'s condition.
fn wait_met(word: u32, value: u32, flags: u32) -> bool {
    match flags & WAIT_CONDITIONS {
        0 => (word.wrapping_sub(value) as i32) >= 0,
        1 => word == value,
        2 => word & value != 0,
        _ => !(word | value) != 0,
    }
}

/// Polls the word at `addr` (written by the host or a kernel, which do
/// not tell the model) until it meets the condition; past the deadline,
/// reports the hang.
fn wait_value(addr: u64, value: u32, flags: u32, dev: usize) -> Res<()> {
    let deadline = std::time::Instant::now() + lock().config().deadline;
    loop {
        // SAFETY: the call checked that the word lies in memory the
        // device reaches, which the program keeps while the wait runs.
        let word = unsafe {
            (*(addr as *const std::sync::atomic::AtomicU32))
                .load(std::sync::atomic::Ordering::Acquire)
        };
        if wait_met(word, value, flags) {
            return Ok(());
        }
        if lock().devices[dev].sticky.is_some() {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            report(format_args!(
                "cuStreamWaitValue32 on device {dev} still waits for the word at {addr:#x} (now \
                 {word}) to meet condition {} against {value}: on a GPU this hangs",
                flags & WAIT_CONDITIONS
            ));
            return Err(CUresult::CUDA_ERROR_LAUNCH_TIMEOUT);
        }
        std::thread::sleep(std::time::Duration::from_micros(100));
    }
}

/// Runs a graph's nodes, each once the nodes it depends on ran; the first
/// failure stops the rest.
fn run_graph(nodes: &[Node], dev: usize) -> Res<()> {
    let progress = Mutex::new((vec![false; nodes.len()], Ok(())));
    let ran = Condvar::new();
    std::thread::scope(|s| {
        for (at, node) in nodes.iter().enumerate() {
            let (progress, ran) = (&progress, &ran);
            s.spawn(move || {
                let mut p = progress.lock();
                while p.1.is_ok() && !node.deps.iter().all(|&d| p.0[d]) {
                    ran.wait(&mut p);
                }
                if p.1.is_err() {
                    return;
                }
                drop(p);
                let result = run(&node.work, dev);
                let mut p = progress.lock();
                p.0[at] = true;
                if let Err(e) = result {
                    p.1 = Err(e);
                }
                ran.notify_all();
            });
        }
    });
    progress.into_inner().1
}

/// Parameter `i` of a launch as a value of type `T`.
fn param<T: Copy>(k: &Kernel, i: usize) -> T {
    assert!(std::mem::size_of::<T>() <= k.params[i].len() * 8);
    // SAFETY: the parameter holds at least `size_of::<T>()` bytes, 8-byte
    // aligned, copied from the launch's arguments of this kernel's type.
    unsafe { k.params[i].as_ptr().cast::<T>().read() }
}

/// The fault a kernel takes touching memory its device cannot reach.
fn unreachable_memory(k: &Kernel, what: &str, ptr: u64, len: u64) -> CUresult {
    report(format_args!(
        "kernel {} on device {} touches {what} at {ptr:#x} ({len} bytes), which is not memory of \
         this device: an illegal address (sticky)",
        k.name, k.dev
    ));
    CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
}

fn check_reach(k: &Kernel, what: &str, ptr: u64, len: u64) -> Res<()> {
    let st = lock();
    if ptr != 0 && !st.reachable(k.dev, ptr, len as usize, false) {
        return Err(unreachable_memory(k, what, ptr, len));
    }
    Ok(())
}

fn run_kernel(k: &Kernel) -> Res<()> {
    {
        let mut st = lock();
        let n = {
            let count = st.launches.entry(k.name).or_insert(0);
            *count += 1;
            *count
        };
        if let Some((name, at)) = &st.config().fault {
            if name == k.name && *at == n {
                report(format_args!(
                    "injected fault: launch {n} of {} on device {} faults (CUDA_ERROR_ILLEGAL_ADDRESS, sticky)",
                    k.name, k.dev
                ));
                return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
            }
        }
    }
    match k.name {
        "rccl_copy" => {
            let (dst, src, bytes): (u64, u64, u64) = (param(k, 0), param(k, 1), param(k, 2));
            check_reach(k, "the destination", dst, bytes)?;
            check_reach(k, "the source", src, bytes)?;
            // One block stands for the grid: its blocks do not wait for
            // each other.
            resident(k, 0, || {
                // SAFETY: both ranges are memory of the device, checked
                // above; the program keeps them while the kernel runs.
                unsafe { twin::copy(dst as *mut c_void, src as *const c_void, bytes) }
            })
        }
        "rccl_run_work" => run_work(k),
        "rccl_fifo_loopback" => {
            report(format_args!("{} is not modeled yet", k.name));
            Err(CUresult::CUDA_ERROR_NOT_SUPPORTED)
        }
        _ => {
            let args: ReduceArgs = param(k, 0);
            let size = ELEMENT_BYTES
                .get(args.dtype as usize)
                .copied()
                .ok_or(CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION)?;
            let bytes = args.count * size;
            check_reach(k, "the accumulator", args.acc as u64, bytes)?;
            check_reach(k, "the input", args.input as u64, bytes)?;
            check_reach(k, "the output", args.out as u64, bytes)?;
            check_reach(k, "the scalar", args.scalar_ptr as u64, size)?;
            resident(k, 0, || {
                // SAFETY: every range is memory of the device, checked
                // above.
                unsafe { twin::reduce(&args) }
            })
        }
    }
}

/// `rccl_run_work`: grid block b runs the channel its entry of the table
/// names (of any rank's work), all blocks at once as far as SMs are free,
/// each writing its end to the word its entry names. The host twin runs a
/// block as thread 0 of 1.
fn run_work(k: &Kernel) -> Res<()> {
    let (table, timeout_ns): (u64, u64) = (param(k, 0), param(k, 1));
    let entry_bytes = std::mem::size_of::<WorkBlock>() as u64;
    check_reach(
        k,
        "the block table",
        table,
        entry_bytes * u64::from(k.blocks),
    )?;
    let entries: Vec<WorkBlock> = (0..k.blocks as usize)
        // SAFETY: the table holds an entry per block (checked).
        .map(|b| unsafe { (table as *const WorkBlock).add(b).read() })
        .collect();
    for entry in &entries {
        let header = std::mem::size_of::<WorkHeader>() as u64;
        check_reach(k, "the work", entry.work as u64, header)?;
        check_reach(k, "a status word", entry.status as u64, 4)?;
        // SAFETY: the header is device memory of the device (checked).
        let nchannels = unsafe { (*entry.work).nchannels };
        if entry.channel >= nchannels {
            report(format_args!(
                "{} on device {}: a block runs channel {} of work of {nchannels} channels",
                k.name, k.dev, entry.channel
            ));
            return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
        }
    }
    std::thread::scope(|s| {
        let blocks: Vec<_> = entries
            .iter()
            .enumerate()
            .map(|(b, entry)| {
                let (work, status, channel) =
                    (entry.work as u64, entry.status as u64, entry.channel);
                s.spawn(move || {
                    resident(k, b as u32, || {
                        // SAFETY: the program's encoded work in device
                        // memory; this thread alone runs this channel.
                        let end = unsafe {
                            twin::run_encoded_channel(
                                work as *const WorkHeader,
                                channel,
                                timeout_ns,
                            )
                        };
                        let code = match end {
                            ChannelEnd::Done => 0,
                            ChannelEnd::Aborted => 1,
                            ChannelEnd::GaveUp => 2,
                            ChannelEnd::TooLarge => 3,
                        };
                        // SAFETY: a status word of the device (checked).
                        unsafe { (status as *mut i32).write_volatile(code) };
                    })
                })
            })
            .collect();
        blocks
            .into_iter()
            .map(|b| b.join().unwrap_or(Err(CUresult::CUDA_ERROR_UNKNOWN)))
            .collect::<Res<Vec<()>>>()
            .map(drop)
    })
}

/// Runs `body` as block `block` of `k`, once one of the device's SMs has
/// room for it (`occupancy.rs`); past the deadline, says that the blocks
/// needed together do not fit.
fn resident<T>(k: &Kernel, block: u32, body: impl FnOnce() -> T) -> Res<T> {
    let mut st = lock();
    let dev = k.dev;
    let needs = k.needs;
    let sms = st.devices[dev].sms.len();
    wait_until(
        &mut st,
        || {
            format!(
                "block {block} of {} on device {dev} waits for a free SM: all {} modeled SMs hold \
                 resident blocks that leave no room for one more ({} threads, {} registers, {} \
                 bytes of shared memory), so a design needing more co-resident blocks",
                k.name, sms, needs.threads, needs.registers, needs.shared
            )
        },
        |s| s.devices[dev].sms.iter().any(|sm| sm.has_room(needs)),
    )?;
    let sm = st.devices[dev]
        .sms
        .iter()
        .position(|sm| sm.has_room(needs))
        .expect("waited for room");
    st.devices[dev].sms[sm].take(needs);
    drop(st);
    let out = body();
    lock().devices[dev].sms[sm].release(needs);
    notify();
    Ok(out)
}
