//! Throughput of the host reduction kernels beside a plain memcpy.
//!
//! Every kernel benchmark computes `out = a + b` over three distinct
//! buffers, i.e. it reads two inputs and writes one output. Criterion's
//! throughput is set to the *output* bytes (`Throughput::Bytes(out_len)`),
//! the same number of bytes the memcpy benchmark copies, so the two are
//! directly comparable; the kernel's memory traffic is 1.5x the memcpy's.
//!
//! The `streaming` group sets the same float32 sum and copy at 64 MiB, far
//! beyond the last-level cache, with cached stores beside non-temporal
//! ones (`Store::Streaming`), in 512 KiB pieces as the
//! engine's FIFO slots cut them (a single 64 MiB memcpy would take the C
//! library's own non-temporal path).
//!
//! Run with `cargo bench --bench kernels`.

#![deny(unsafe_op_in_unsafe_fn)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use rccl::kernels::{encode_f64, ReduceKernel, Store};
use rccl::{DataType, RedOp};

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// A buffer of `bytes` bytes holding small values of `dtype`, 8-byte aligned.
fn filled(dtype: DataType, bytes: usize, seed: usize) -> Vec<u64> {
    let mut words = vec![0u64; bytes.div_ceil(8)];
    let buf = bytemuck::cast_slice_mut::<u64, u8>(&mut words);
    let size = dtype.size();
    for (i, elem) in buf[..bytes].chunks_exact_mut(size).enumerate() {
        encode_f64(dtype, ((i + seed) % 7) as f64 * 0.25 + 0.5, elem);
    }
    words
}

fn bench_sum(c: &mut Criterion, group_name: &str, dtype: DataType, sizes: &[usize], memcpy: bool) {
    let mut group = c.benchmark_group(group_name);
    group
        .measurement_time(Duration::from_secs(2))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(20);
    let kernel = ReduceKernel::new(dtype, RedOp::Sum, 2).expect("valid kernel");
    for &bytes in sizes {
        let count = bytes / dtype.size();
        let a = filled(dtype, bytes, 0);
        let b = filled(dtype, bytes, 3);
        let mut out = vec![0u64; bytes.div_ceil(8)];
        group.throughput(Throughput::Bytes(bytes as u64));
        let label = if bytes >= MIB {
            format!("{}MiB", bytes / MIB)
        } else {
            format!("{}KiB", bytes / KIB)
        };
        if memcpy {
            group.bench_function(BenchmarkId::new("memcpy", &label), |bench| {
                bench.iter(|| {
                    // SAFETY: `a` and `out` are distinct allocations of at
                    // least `bytes` bytes.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            a.as_ptr().cast::<u8>(),
                            out.as_mut_ptr().cast::<u8>(),
                            bytes,
                        )
                    };
                    black_box(&mut out);
                })
            });
        }
        group.bench_function(
            BenchmarkId::new(format!("{}_sum", dtype.name()), &label),
            |bench| {
                bench.iter(|| {
                    // SAFETY: three distinct allocations of at least `bytes`
                    // bytes, i.e. `count` elements.
                    unsafe {
                        kernel.run(
                            Some(a.as_ptr().cast()),
                            b.as_ptr().cast(),
                            out.as_mut_ptr().cast(),
                            count,
                            true,
                        )
                    };
                    black_box(&mut out);
                })
            },
        );
    }
    group.finish();
}

/// Float32 sum and copy of 64 MiB with cached and with non-temporal
/// stores.
fn bench_streaming(c: &mut Criterion) {
    let mut group = c.benchmark_group("streaming");
    group
        .measurement_time(Duration::from_secs(3))
        .warm_up_time(Duration::from_millis(500))
        .sample_size(10);
    let bytes = 64 * MIB;
    let piece = 512 * KIB;
    let kernel = ReduceKernel::new(DataType::Float32, RedOp::Sum, 2).expect("valid kernel");
    let a = filled(DataType::Float32, bytes, 0);
    let b = filled(DataType::Float32, bytes, 3);
    let mut out = vec![0u64; bytes / 8];
    group.throughput(Throughput::Bytes(bytes as u64));
    for (store, stores) in [(Store::Cached, "cached"), (Store::Streaming, "streaming")] {
        group.bench_function(BenchmarkId::new("float32_sum", stores), |bench| {
            bench.iter(|| {
                for at in (0..bytes).step_by(piece) {
                    // SAFETY: three distinct allocations of `bytes` bytes;
                    // each piece lies inside them.
                    unsafe {
                        let acc = Some(a.as_ptr().cast::<u8>().add(at));
                        let input = b.as_ptr().cast::<u8>().add(at);
                        let o = out.as_mut_ptr().cast::<u8>().add(at);
                        kernel.run_with_store(store, acc, input, o, piece / 4, true)
                    };
                }
                black_box(&mut out);
            })
        });
        group.bench_function(BenchmarkId::new("copy", stores), |bench| {
            bench.iter(|| {
                for at in (0..bytes).step_by(piece) {
                    // SAFETY: `a` and `out` are distinct allocations of
                    // `bytes` bytes; each piece lies inside them.
                    unsafe {
                        let src = a.as_ptr().cast::<u8>().add(at);
                        let dst = out.as_mut_ptr().cast::<u8>().add(at);
                        store.copy(src, dst, piece)
                    };
                }
                black_box(&mut out);
            })
        });
    }
    group.finish();
}

fn kernels(c: &mut Criterion) {
    bench_sum(
        c,
        "sum_vs_memcpy",
        DataType::Float32,
        &[64 * KIB, MIB, 16 * MIB],
        true,
    );
    bench_sum(c, "narrow_sum", DataType::Bfloat16, &[MIB], false);
    bench_sum(c, "narrow_sum", DataType::Float8e4m3, &[MIB], false);
    bench_streaming(c);
}

criterion_group!(benches, kernels);
criterion_main!(benches);
