//! Checks the CUDA kernels on a GPU: every reduction kernel x datatype x
//! operator against the host twin (the same sources compiled for the CPU,
//! which the test suite holds to rccl's host kernels bit for bit), the
//! FIFO protocols across two blocks, then the bandwidth of a
//! device-to-device copy and of the reduction kernel, read and write
//! counted, and their ratio.
//!
//! Usage: rccl-kernel-check [--bytes N] [--iters N] [--skip-fifos]
//! (`--skip-fifos`: for a driver without the FIFO loopback kernel, such as
//! the CUDA driver model; the summary then says `fifo_wrong=skipped`).
//! Exit status: 0 when nothing was wrong, 1 when something was, 2 when no
//! GPU could be used. The last line is a summary for scripts:
//! `RESULT wrong=.. fifo_wrong=.. copy_GBps=.. reduce_GBps=.. ratio=..`.

#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_void;
use std::process::ExitCode;

use rccl_algorithms::protocol::{fifo_bytes, Protocol};
use rccl_device::abi::{op, FifoView, LoopbackArgs, ReduceArgs};
use rccl_device::cuda::{CUdeviceptr, CUstream, CudaError, Driver, Kernels, Memory};
use rccl_device::twin;

const TYPES: [(&str, usize); 12] = [
    ("int8", 1),
    ("uint8", 1),
    ("int32", 4),
    ("uint32", 4),
    ("int64", 8),
    ("uint64", 8),
    ("half", 2),
    ("float", 4),
    ("double", 8),
    ("bfloat16", 2),
    ("f8e4m3", 1),
    ("f8e5m2", 1),
];

/// xorshift64*: the inputs, the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Random bits, with a share of small values (denormals of the narrow
/// formats) and of all-ones exponents (infinities, NaN).
fn fill(bytes: &mut [u8], size: usize, rng: &mut Rng) {
    for chunk in bytes.chunks_mut(size) {
        let r = rng.next();
        let bits = match r % 8 {
            0 => r >> 60,
            1 => !0u64 >> (r % 3),
            _ => rng.next(),
        };
        chunk.copy_from_slice(&bits.to_le_bytes()[..size]);
    }
}

/// A PreMulSum scalar of `size` bytes: 3 for integers, 2.5 in the
/// float types' encodings.
fn scalar_for(dtype: usize) -> u64 {
    match dtype {
        0..=5 => 3,
        6 => 0x4100,                // fp16 2.5
        7 => 0x4020_0000,           // fp32 2.5
        8 => 0x4004_0000_0000_0000, // fp64 2.5
        9 => 0x4020,                // bf16 2.5
        10 => 0x42,                 // e4m3 2.5
        _ => 0x41,                  // e5m2 2.5
    }
}

struct Gpu {
    driver: &'static Driver,
    kernels: Kernels,
    stream: CUstream,
}

impl Gpu {
    fn alloc(&self, bytes: usize) -> Result<CUdeviceptr, CudaError> {
        // SAFETY: the stream lives as long as the `Gpu`.
        unsafe { self.driver.alloc(bytes, self.stream) }
    }
}

/// Frees device memory when dropped.
struct DevBuf<'a> {
    gpu: &'a Gpu,
    ptr: CUdeviceptr,
}

impl<'a> DevBuf<'a> {
    fn new(gpu: &'a Gpu, bytes: usize) -> Result<DevBuf<'a>, CudaError> {
        Ok(DevBuf {
            gpu,
            ptr: gpu.alloc(bytes)?,
        })
    }
    fn upload(&self, data: &[u8]) -> Result<(), CudaError> {
        // SAFETY: the buffer was allocated with at least `data.len()` bytes
        // by every caller.
        unsafe {
            self.gpu
                .driver
                .copy_to_device(self.ptr, data, self.gpu.stream)
        }
    }
    fn download(&self, data: &mut [u8]) -> Result<(), CudaError> {
        // SAFETY: as `upload`.
        unsafe {
            self.gpu
                .driver
                .copy_to_host(data, self.ptr, self.gpu.stream)
        }
    }
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // SAFETY: the stream is synchronized before any buffer is dropped
        // (every check ends with a synchronize).
        let _ = unsafe { self.gpu.driver.free(self.ptr, self.gpu.stream) };
    }
}

/// One reduction case on the GPU and on the twin; the number of elements
/// whose bits differ.
#[allow(clippy::too_many_arguments)]
fn check_case(
    gpu: &Gpu,
    dtype: usize,
    red: i32,
    device_scalar: bool,
    with_acc: bool,
    in_place: bool,
    offset_elems: usize,
    count: usize,
    rng: &mut Rng,
) -> Result<usize, CudaError> {
    let size = TYPES[dtype].1;
    let off = offset_elems * size;
    let bytes = count * size;
    let mut acc = vec![0u8; off + bytes];
    let mut input = vec![0u8; off + bytes];
    fill(&mut acc[off..], size, rng);
    fill(&mut input[off..], size, rng);
    let scalar = scalar_for(dtype);
    let nranks = if red == op::AVG { 3 } else { 2 };

    // The twin: host buffers.
    let mut host_out = if in_place {
        acc.clone()
    } else {
        vec![0u8; off + bytes]
    };
    let mut args = ReduceArgs::new(
        dtype as i32,
        red,
        nranks,
        scalar.to_le_bytes(),
        if with_acc {
            acc[off..].as_ptr().cast()
        } else {
            std::ptr::null()
        },
        input[off..].as_ptr().cast(),
        host_out[off..].as_mut_ptr().cast(),
        count as u64,
        true,
    );
    if in_place && with_acc {
        args.acc = host_out[off..].as_ptr().cast();
    }
    // SAFETY: every pointer covers `count` elements; out is disjoint from
    // the input and identical to or disjoint from the accumulator.
    unsafe { twin::reduce(&args) };

    // The GPU.
    let d_acc = DevBuf::new(gpu, off + bytes)?;
    let d_in = DevBuf::new(gpu, off + bytes)?;
    let d_out = DevBuf::new(gpu, off + bytes)?;
    let d_scalar = DevBuf::new(gpu, 8)?;
    d_acc.upload(&acc)?;
    d_in.upload(&input)?;
    d_scalar.upload(&scalar.to_le_bytes())?;
    let out_ptr = if in_place { d_acc.ptr } else { d_out.ptr };
    let mut dargs = args;
    dargs.acc = if with_acc {
        (d_acc.ptr + off as u64) as *const c_void
    } else {
        std::ptr::null()
    };
    dargs.input = (d_in.ptr + off as u64) as *const c_void;
    dargs.out = (out_ptr + off as u64) as *mut c_void;
    if device_scalar {
        dargs.scalar = 0;
        dargs.scalar_ptr = d_scalar.ptr as *const c_void;
    }
    // SAFETY: the device buffers cover the ranges; synchronized below.
    unsafe {
        gpu.kernels.reduce(&dargs, gpu.stream)?;
        gpu.driver.synchronize(gpu.stream)?;
    }
    let mut dev_out = vec![0u8; off + bytes];
    if in_place {
        d_acc.download(&mut dev_out)?;
    } else {
        d_out.download(&mut dev_out)?;
    }
    Ok(dev_out[off..]
        .chunks(size)
        .zip(host_out[off..].chunks(size))
        .filter(|(a, b)| a != b)
        .count())
}

fn check_reductions(gpu: &Gpu) -> Result<usize, CudaError> {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let ops = [
        ("sum", op::SUM, false),
        ("prod", op::PROD, false),
        ("max", op::MAX, false),
        ("min", op::MIN, false),
        ("avg", op::AVG, false),
        ("premulsum", op::PRE_MUL_SUM, false),
        ("premulsum(dev)", op::PRE_MUL_SUM, true),
    ];
    println!("# kernel x datatype x op against the host twin (cases, wrong elements)");
    print!("{:>10}", "type");
    for (name, _, _) in ops {
        print!(" {name:>15}");
    }
    println!();
    let mut total_wrong = 0;
    for (dtype, (tname, _)) in TYPES.iter().enumerate() {
        print!("{tname:>10}");
        for &(_, red, device_scalar) in &ops {
            let mut wrong = 0;
            let mut cases = 0;
            for with_acc in [true, false] {
                for in_place in [false, true] {
                    // Aligned (16-byte packs) and one element off.
                    for offset in [0, 1] {
                        let count = (1 << 18) + 77;
                        wrong += check_case(
                            gpu,
                            dtype,
                            red,
                            device_scalar,
                            with_acc,
                            in_place,
                            offset,
                            count,
                            &mut rng,
                        )?;
                        cases += 1;
                    }
                }
            }
            print!(" {:>9} {:>5}", cases, wrong);
            total_wrong += wrong;
        }
        println!();
    }
    Ok(total_wrong)
}

/// Each protocol's FIFO between two blocks; the number of protocols whose
/// bytes or pieces came out wrong.
fn check_fifos(gpu: &Gpu) -> Result<usize, CudaError> {
    let mut rng = Rng(42);
    let bytes = (1 << 20) + 13;
    let mut src = vec![0u8; bytes];
    fill(&mut src, 1, &mut rng);
    let mut wrong = 0;
    println!("# FIFO protocols, block to block ({bytes} bytes)");
    for protocol in Protocol::ALL {
        let name = protocol.name();
        let (nslots, slot_bytes) = (8u32, 4080u32);
        let fifo_bytes = fifo_bytes(protocol, nslots as usize, slot_bytes as usize);
        let mem = DevBuf::new(gpu, fifo_bytes)?;
        let d_src = DevBuf::new(gpu, bytes)?;
        let d_dst = DevBuf::new(gpu, bytes)?;
        let status = DevBuf::new(gpu, 8)?;
        // SAFETY: the buffers are this size; synchronized before use.
        unsafe {
            gpu.driver.memset(mem.ptr, 0, fifo_bytes, gpu.stream)?;
            gpu.driver.memset(d_dst.ptr, 0, bytes, gpu.stream)?;
            gpu.driver.memset(status.ptr, 0, 8, gpu.stream)?;
        }
        d_src.upload(&src)?;
        let args = LoopbackArgs {
            fifo: FifoView::whole(mem.ptr as *mut u8, protocol.abi(), nslots, slot_bytes),
            src: d_src.ptr,
            dst: d_dst.ptr,
            bytes: bytes as u64,
            spins: 1 << 22,
            status: status.ptr,
        };
        let ms = {
            // SAFETY: as above.
            unsafe {
                gpu.driver
                    .time_ms(gpu.stream, || gpu.kernels.fifo_loopback(&args, gpu.stream))?
            }
        };
        let mut dst = vec![0u8; bytes];
        d_dst.download(&mut dst)?;
        let mut st = [0u8; 8];
        status.download(&mut st)?;
        let pieces = u32::from_le_bytes(st[..4].try_into().expect("4 bytes"));
        let errors = u32::from_le_bytes(st[4..].try_into().expect("4 bytes"));
        let expected = bytes.div_ceil(slot_bytes as usize) as u32;
        let ok = dst == src && pieces == expected && errors == 0;
        println!(
            "{name:>8}: {pieces}/{expected} pieces, error mask {errors}, bytes {}, {:.1} MB/s",
            if dst == src { "ok" } else { "WRONG" },
            bytes as f64 / (f64::from(ms) * 1e3)
        );
        wrong += usize::from(!ok);
    }
    Ok(wrong)
}

/// Bytes per second of `work` (run `iters` times after one warm-up),
/// counting `moved` bytes per run.
fn rate(
    gpu: &Gpu,
    iters: u32,
    moved: f64,
    work: &dyn Fn() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    work()?;
    // SAFETY: the stream is live; `work` launches on it.
    let ms = unsafe {
        gpu.driver.time_ms(gpu.stream, || {
            for _ in 0..iters {
                work()?;
            }
            Ok(())
        })?
    };
    Ok(moved * f64::from(iters) / (f64::from(ms) * 1e-3))
}

fn bandwidth(gpu: &Gpu, bytes: usize, iters: u32) -> Result<(f64, f64), CudaError> {
    let a = DevBuf::new(gpu, bytes)?;
    let b = DevBuf::new(gpu, bytes)?;
    let c = DevBuf::new(gpu, bytes)?;
    // SAFETY: the buffers hold `bytes` bytes each.
    unsafe {
        gpu.driver.memset(a.ptr, 0x3c, bytes, gpu.stream)?;
        gpu.driver.memset(b.ptr, 0x3c, bytes, gpu.stream)?;
    }
    let gb = |r: f64| r / 1e9;
    // SAFETY: (every closure) the ranges lie in the buffers above, which
    // outlive the timed work (time_ms synchronizes).
    let copy = rate(gpu, iters, 2.0 * bytes as f64, &|| unsafe {
        gpu.driver.copy_async(c.ptr, a.ptr, bytes, gpu.stream)
    })?;
    let kcopy = rate(gpu, iters, 2.0 * bytes as f64, &|| unsafe {
        gpu.kernels.copy(c.ptr, a.ptr, bytes as u64, gpu.stream)
    })?;
    println!(
        "# bandwidth, {} MiB buffers, read + write counted (GB/s)",
        bytes >> 20
    );
    println!("{:>24} {:>10.1}", "cuMemcpyDtoDAsync", gb(copy));
    println!("{:>24} {:>10.1}", "copy kernel", gb(kcopy));
    let mut headline = 0.0;
    for (dtype, (tname, size)) in TYPES.iter().enumerate() {
        let count = (bytes / size) as u64;
        let args = ReduceArgs::new(
            dtype as i32,
            op::SUM,
            2,
            [0; 8],
            a.ptr as *const c_void,
            b.ptr as *const c_void,
            c.ptr as *mut c_void,
            count,
            true,
        );
        let r = rate(gpu, iters, 3.0 * bytes as f64, &|| unsafe {
            gpu.kernels.reduce(&args, gpu.stream)
        })?;
        println!(
            "{:>24} {:>10.1} {:>6.1}%",
            format!("reduce sum {tname}"),
            gb(r),
            100.0 * r / copy
        );
        if *tname == "float" {
            headline = r;
        }
    }
    Ok((copy, headline))
}

fn run(bytes: usize, iters: u32, fifos: bool) -> Result<bool, CudaError> {
    let driver = Driver::get()?;
    let device = driver.current_device()?;
    println!("# [cuda {device}] {}", driver.device_name(device)?);
    let kernels = driver.load_kernels(device)?;
    let stream = driver.create_stream()?;
    let gpu = Gpu {
        driver,
        kernels,
        stream,
    };
    let probe = DevBuf::new(&gpu, 16)?;
    let kind = driver.classify(probe.ptr as *const c_void)?;
    let host = [0u8; 16];
    let host_kind = driver.classify(host.as_ptr().cast())?;
    println!("# pointers: cuMemAlloc -> {kind:?}, stack -> {host_kind:?}");
    let classify_ok = kind == Memory::Device(device) && host_kind == Memory::Host;
    drop(probe);
    let wrong = check_reductions(&gpu)?;
    let fifo_wrong = if fifos {
        Some(check_fifos(&gpu)?)
    } else {
        None
    };
    let (copy, reduce) = bandwidth(&gpu, bytes, iters)?;
    // SAFETY: all work on the stream is complete.
    unsafe { driver.destroy_stream(stream)? };
    println!(
        "RESULT wrong={wrong} fifo_wrong={} classify={} copy_GBps={:.1} reduce_GBps={:.1} ratio={:.3}",
        fifo_wrong.map_or("skipped".to_string(), |n| n.to_string()),
        if classify_ok { "ok" } else { "WRONG" },
        copy / 1e9,
        reduce / 1e9,
        reduce / copy
    );
    Ok(wrong == 0 && fifo_wrong.unwrap_or(0) == 0 && classify_ok)
}

fn main() -> ExitCode {
    let mut bytes = 256usize << 20;
    let mut iters = 20u32;
    let mut fifos = true;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--skip-fifos" {
            fifos = false;
            continue;
        }
        let value = it.next().and_then(|v| v.parse::<u64>().ok());
        match (a.as_str(), value) {
            ("--bytes", Some(v)) => bytes = v as usize,
            ("--iters", Some(v)) => iters = v.max(1) as u32,
            _ => {
                eprintln!("usage: rccl-kernel-check [--bytes N] [--iters N] [--skip-fifos]");
                return ExitCode::from(2);
            }
        }
    }
    match run(bytes, iters, fifos) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("rccl-kernel-check: {e}");
            ExitCode::from(2)
        }
    }
}
