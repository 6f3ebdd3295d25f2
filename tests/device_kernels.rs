//! The CUDA kernels' sources, compiled for the host (rccl-device's twin),
//! against rccl's host kernels and FIFOs: every datatype x operator bit
//! for bit, on inputs with NaN, infinities, denormals and fp8 saturation
//! edges; and every protocol's slots written by one side and read by the
//! other.

use std::ffi::c_void;
use std::sync::Arc;

use rccl::kernels::{encode_f64, ReduceKernel};
use rccl::{DataType, RedOp};
use rccl_device::abi::{op, FifoView, ReduceArgs};
use rccl_device::twin;
use rccl_transports::{fifo_bytes, FifoMemory, HeapMemory};
use rccl_transports::{Fifo, Protocol, Tag};

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Values every datatype's inputs include, as `f64` (encoded with
/// rounding, so fp8 gets its saturation edges and e5m2 its overflow).
const SPECIAL: &[f64] = &[
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    3.0,
    f64::INFINITY,
    f64::NEG_INFINITY,
    448.0,
    -448.0,
    464.0,
    480.0,
    -500.0,
    57344.0,
    61440.0,
    65504.0,
    65520.0,
    1.0e-3,
    1.0 / 512.0,
    1.0 / 1024.0,
    1.0 / 65536.0,
    6.0e-8,
    1.0e-40,
    -1.0e-40,
    1.0e-310,
    3.0e38,
    -3.0e38,
    1.0e300,
    127.0,
    -128.0,
    255.0,
    2147483647.0,
    -2147483648.0,
];

/// Bit patterns of one NaN family per datatype: a quiet NaN and the
/// signalling NaN that quiets to it (two NaNs combined give one of them,
/// and which one depends on the host compiler's operand order; see
/// `nan_at`'s uses).
fn nan_family(dtype: DataType) -> &'static [u64] {
    match dtype {
        DataType::Float16 => &[0x7e05, 0x7c05],
        DataType::Bfloat16 => &[0x7fc5, 0x7f85],
        DataType::Float32 => &[0x7fc0_0123, 0x7f80_0123],
        DataType::Float64 => &[0x7ff8_0000_0000_0123, 0x7ff0_0000_0000_0123],
        DataType::Float8e4m3 => &[0x7f],
        DataType::Float8e5m2 => &[0x7d, 0x7e, 0x7f],
        _ => &[],
    }
}

fn is_nan(dtype: DataType, bits: u64) -> bool {
    match dtype {
        DataType::Float16 => bits & 0x7fff > 0x7c00,
        DataType::Bfloat16 => bits & 0x7fff > 0x7f80,
        DataType::Float32 => bits & 0x7fff_ffff > 0x7f80_0000,
        DataType::Float64 => bits & 0x7fff_ffff_ffff_ffff > 0x7ff0_0000_0000_0000,
        DataType::Float8e4m3 => bits & 0x7f == 0x7f,
        DataType::Float8e5m2 => bits & 0x7f > 0x7c,
        _ => false,
    }
}

/// Whether element `i` of `bytes` is a NaN of `dtype`.
fn nan_at(dtype: DataType, bytes: &[u8], i: usize) -> bool {
    let size = dtype.size();
    let mut w = [0u8; 8];
    w[..size].copy_from_slice(&bytes[i * size..(i + 1) * size]);
    is_nan(dtype, u64::from_le_bytes(w))
}

/// `count` elements of `dtype`: random bits, special values and NaNs.
fn data(dtype: DataType, count: usize, rng: &mut Rng) -> Vec<u8> {
    let size = dtype.size();
    let mut out = vec![0u8; count * size];
    for chunk in out.chunks_mut(size) {
        let pick = rng.next();
        let mut bits = rng.next();
        match pick % 8 {
            0..=2 => {
                let v = SPECIAL[(pick >> 8) as usize % SPECIAL.len()];
                encode_f64(dtype, v, chunk);
                continue;
            }
            3 if dtype.is_float() => {
                let family = nan_family(dtype);
                bits = family[(pick >> 8) as usize % family.len()];
            }
            // Small magnitudes: denormals of the narrow formats, and
            // integers that sum and multiply without only wrapping.
            4 => bits &= 0x0f,
            _ => {}
        }
        if dtype.is_float() && is_nan(dtype, bits) && !nan_family(dtype).contains(&bits) {
            bits = nan_family(dtype)[0];
        }
        chunk.copy_from_slice(&bits.to_le_bytes()[..size]);
    }
    out
}

/// 16-byte aligned byte buffers (what the kernels' pack path needs).
struct Aligned(Vec<u128>);

impl Aligned {
    fn new(bytes: usize) -> Aligned {
        Aligned(vec![0; bytes.div_ceil(16) + 1])
    }
    fn ptr(&mut self, offset: usize) -> *mut u8 {
        // SAFETY: callers keep `offset + len` within the buffer (one spare
        // 16-byte word covers the offsets used here).
        unsafe { self.0.as_mut_ptr().cast::<u8>().add(offset) }
    }
    fn bytes(&mut self, offset: usize, len: usize) -> &mut [u8] {
        // SAFETY: as `ptr`; the buffer outlives the slice.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(offset), len) }
    }
}

fn scalar_bytes(dtype: DataType, value: f64) -> [u8; 8] {
    let mut s = [0u8; 8];
    encode_f64(dtype, value, &mut s);
    s
}

/// Every operator to check for `dtype`, with the rank count it uses.
fn ops(dtype: DataType) -> Vec<(RedOp, usize)> {
    let mut ops = vec![
        (RedOp::Sum, 2),
        (RedOp::Prod, 2),
        (RedOp::Max, 2),
        (RedOp::Min, 2),
        (RedOp::Avg, 1),
        (RedOp::Avg, 3),
        (RedOp::Avg, 8),
    ];
    let scalars: &[f64] = if dtype.is_float() {
        &[1.0, 2.5, -0.375, 1.0e-3, 6.0e-8, 300.0]
    } else {
        &[1.0, 3.0, -2.0, 0.0, 200.0]
    };
    for &s in scalars {
        ops.push((
            RedOp::PreMulSum {
                scalar: scalar_bytes(dtype, s),
            },
            2,
        ));
    }
    ops
}

fn op_code(red: RedOp) -> (i32, [u8; 8]) {
    match red {
        RedOp::Sum => (op::SUM, [0; 8]),
        RedOp::Prod => (op::PROD, [0; 8]),
        RedOp::Max => (op::MAX, [0; 8]),
        RedOp::Min => (op::MIN, [0; 8]),
        RedOp::Avg => (op::AVG, [0; 8]),
        RedOp::PreMulSum { scalar } => (op::PRE_MUL_SUM, scalar),
        RedOp::PreMulSumDevice { .. } => unreachable!("the cases' scalars are values"),
    }
}

/// Where the output goes relative to the inputs.
#[derive(Clone, Copy, Debug)]
enum Place {
    Apart,
    OnAcc,
    OnInput,
}

/// Runs one reduction through rccl's host kernel and through the twin
/// (with the scalar passed by value, then by pointer) and compares bits.
#[allow(clippy::too_many_arguments)]
fn check_one(
    dtype: DataType,
    red: RedOp,
    nranks: usize,
    with_acc: bool,
    finish: bool,
    place: Place,
    offsets: [usize; 3],
    count: usize,
    rng: &mut Rng,
) {
    let [acc_off, in_off, out_off] = offsets;
    let bytes = count * dtype.size();
    let acc_data = data(dtype, count, rng);
    let in_data = data(dtype, count, rng);
    let kernel = ReduceKernel::new(dtype, red, nranks).expect("kernel");
    let (code, scalar) = op_code(red);
    let mut results = Vec::new();
    for way in 0..3 {
        let mut acc = Aligned::new(bytes + acc_off);
        let mut input = Aligned::new(bytes + in_off);
        let mut out = Aligned::new(bytes + out_off);
        acc.bytes(acc_off, bytes).copy_from_slice(&acc_data);
        input.bytes(in_off, bytes).copy_from_slice(&in_data);
        let a = acc.ptr(acc_off);
        let b = input.ptr(in_off);
        let o = match place {
            Place::Apart => out.ptr(out_off),
            Place::OnAcc if with_acc => a,
            _ => b,
        };
        let acc_ptr = with_acc.then_some(a.cast_const());
        let mut args = ReduceArgs::new(
            dtype as i32,
            code,
            nranks as u64,
            scalar,
            acc_ptr.unwrap_or(std::ptr::null()).cast(),
            b.cast_const().cast(),
            o.cast::<c_void>(),
            count as u64,
            finish,
        );
        match way {
            // SAFETY: every pointer is valid for `count` elements; the
            // output is disjoint from or identical to each input.
            0 => unsafe { kernel.run(acc_ptr, b, o, count, finish) },
            1 => unsafe { twin::reduce(&args) },
            _ => {
                // A device scalar: read through a pointer, not passed.
                args.scalar = 0;
                args.scalar_ptr = scalar.as_ptr().cast();
                // SAFETY: as above; the scalar outlives the call.
                unsafe { twin::reduce(&args) }
            }
        }
        // SAFETY: `o` points at `bytes` initialized bytes of one buffer.
        results.push(unsafe { std::slice::from_raw_parts(o, bytes) }.to_vec());
    }
    // The input as the combine sees it (after the input transform).
    let mut operand = vec![0u8; bytes];
    // SAFETY: both buffers hold `count` elements and are disjoint.
    unsafe { kernel.run(None, in_data.as_ptr(), operand.as_mut_ptr(), count, false) };
    for (way, got) in results.iter().enumerate().skip(1) {
        if let Some(i) = (0..count).find(|&i| {
            let r = i * dtype.size()..(i + 1) * dtype.size();
            let both_nan = with_acc && nan_at(dtype, &acc_data, i) && nan_at(dtype, &operand, i);
            got[r.clone()] != results[0][r] && !(both_nan && nan_at(dtype, got, i))
        }) {
            let r = i * dtype.size()..(i + 1) * dtype.size();
            panic!(
                "{dtype:?} {red:?} nranks {nranks} acc {with_acc} finish {finish} {place:?} \
                 offsets {offsets:?} count {count} way {way}: element {i}: acc {:02x?} input {:02x?} \
                 host {:02x?} twin {:02x?}",
                &acc_data[r.clone()],
                &in_data[r.clone()],
                &results[0][r.clone()],
                &got[r]
            );
        }
    }
}

#[test]
fn every_datatype_and_operator_matches_the_host_kernels_bit_for_bit() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut runs = 0;
    for dtype in DataType::ALL {
        for (red, nranks) in ops(dtype) {
            for with_acc in [true, false] {
                for finish in [true, false] {
                    // Aligned (the 16-byte pack path), one element off (the
                    // element path) and one byte off (unaligned elements).
                    for offset in [0, dtype.size(), 1] {
                        for place in [Place::Apart, Place::OnAcc, Place::OnInput] {
                            let count = 517 + (rng.next() % 64) as usize;
                            check_one(
                                dtype,
                                red,
                                nranks,
                                with_acc,
                                finish,
                                place,
                                [offset; 3],
                                count,
                                &mut rng,
                            );
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 3000, "{runs} runs");
}

/// Short and odd-sized reductions whose ends start anywhere in a 16-byte
/// word: the elements before the first common 16-byte boundary, the packs
/// and the elements after the last one (or every element one at a time,
/// when the ends disagree modulo 16) match the host bit for bit.
#[test]
fn unaligned_heads_and_tails_of_every_datatype_and_operator_match_the_host() {
    let mut rng = Rng(0x5151_7a7a);
    let mut runs = 0;
    for dtype in DataType::ALL {
        let size = dtype.size();
        let per_pack = 16 / size;
        // Ends agreeing modulo 16 at every element offset inside a word,
        // ends agreeing only modulo the element, and byte-misaligned ends.
        let mut layouts: Vec<[usize; 3]> = (0..per_pack).map(|k| [k * size; 3]).collect();
        layouts.extend([[0, size, 0], [16 - size, 0, size], [1, 1, 1], [3, 0, 5]]);
        // Fewer elements than a head, one pack, a round of packs per
        // thread and then some.
        let counts = [
            1,
            per_pack - 1,
            per_pack + 1,
            4 * per_pack + 3,
            9 * per_pack + 1,
        ];
        for (red, nranks) in ops(dtype) {
            for &offsets in &layouts {
                for count in counts.into_iter().filter(|&c| c > 0) {
                    for with_acc in [true, false] {
                        check_one(
                            dtype,
                            red,
                            nranks,
                            with_acc,
                            true,
                            Place::Apart,
                            offsets,
                            count,
                            &mut rng,
                        );
                        runs += 1;
                    }
                }
            }
        }
    }
    assert!(runs > 2000, "{runs} runs");
}

/// A partial result (the `partial` flag) takes no input transform: the
/// twin matches rccl's kernel for the op that combines partial results.
#[test]
fn partial_inputs_combine_as_the_host_combines_them() {
    let mut rng = Rng(99);
    for dtype in DataType::ALL {
        for (red, nranks) in ops(dtype) {
            let partial_op = match red {
                RedOp::PreMulSum { .. } => RedOp::Sum,
                RedOp::Avg if dtype.is_float() => RedOp::Sum,
                other => other,
            };
            let kernel = ReduceKernel::new(dtype, partial_op, nranks).expect("kernel");
            let count = 300;
            let acc = data(dtype, count, &mut rng);
            let input = data(dtype, count, &mut rng);
            let mut host = vec![0u8; acc.len()];
            let mut mine = vec![0u8; acc.len()];
            // SAFETY: every buffer holds `count` elements; outputs are
            // disjoint from the inputs.
            unsafe {
                kernel.run(
                    Some(acc.as_ptr()),
                    input.as_ptr(),
                    host.as_mut_ptr(),
                    count,
                    true,
                )
            };
            let (code, scalar) = op_code(red);
            let mut args = ReduceArgs::new(
                dtype as i32,
                code,
                nranks as u64,
                scalar,
                acc.as_ptr().cast(),
                input.as_ptr().cast(),
                mine.as_mut_ptr().cast(),
                count as u64,
                true,
            );
            args.partial = 1;
            // SAFETY: as above.
            unsafe { twin::reduce(&args) };
            for i in 0..count {
                let r = i * dtype.size()..(i + 1) * dtype.size();
                let both_nan = nan_at(dtype, &acc, i) && nan_at(dtype, &input, i);
                assert!(
                    host[r.clone()] == mine[r.clone()] || (both_nan && nan_at(dtype, &mine, i)),
                    "{dtype:?} {red:?} element {i}"
                );
            }
        }
    }
}

/// Every pair of values of the 8-bit float types (all 65536), and all
/// fp16 / bf16 values against a spread of partners, for every combine.
#[test]
fn narrow_floats_match_on_every_code() {
    for dtype in [DataType::Float8e4m3, DataType::Float8e5m2] {
        let acc: Vec<u8> = (0..65536u32).map(|i| (i >> 8) as u8).collect();
        let input: Vec<u8> = (0..65536u32).map(|i| i as u8).collect();
        for red in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min] {
            compare_whole(dtype, red, &acc, &input);
        }
    }
    for dtype in [DataType::Float16, DataType::Bfloat16] {
        let mut rng = Rng(7);
        let all: Vec<u16> = (0..=u16::MAX)
            .map(|v| {
                if is_nan(dtype, v.into()) {
                    nan_family(dtype)[0] as u16
                } else {
                    v
                }
            })
            .collect();
        let acc: Vec<u8> = all.iter().flat_map(|v| v.to_le_bytes()).collect();
        let input = data(dtype, all.len(), &mut rng);
        for red in [RedOp::Sum, RedOp::Prod, RedOp::Max, RedOp::Min] {
            compare_whole(dtype, red, &acc, &input);
        }
    }
}

/// `acc OP input` through both, compared bit for bit, except that a NaN
/// combined with a NaN need only give a NaN (x86 returns the operand the
/// compiler put first).
fn compare_whole(dtype: DataType, red: RedOp, acc: &[u8], input: &[u8]) {
    let count = acc.len() / dtype.size();
    let kernel = ReduceKernel::new(dtype, red, 2).expect("kernel");
    let mut host = vec![0u8; acc.len()];
    let mut mine = vec![0u8; acc.len()];
    // SAFETY: all buffers hold `count` elements and are disjoint.
    unsafe {
        kernel.run(
            Some(acc.as_ptr()),
            input.as_ptr(),
            host.as_mut_ptr(),
            count,
            true,
        )
    };
    let (code, scalar) = op_code(red);
    let args = ReduceArgs::new(
        dtype as i32,
        code,
        2,
        scalar,
        acc.as_ptr().cast(),
        input.as_ptr().cast(),
        mine.as_mut_ptr().cast(),
        count as u64,
        true,
    );
    // SAFETY: as above.
    unsafe { twin::reduce(&args) };
    let size = dtype.size();
    for i in 0..count {
        let r = i * size..(i + 1) * size;
        if nan_at(dtype, acc, i) && nan_at(dtype, input, i) {
            assert!(nan_at(dtype, &mine, i) && nan_at(dtype, &host, i));
            continue;
        }
        assert_eq!(
            host[r.clone()],
            mine[r.clone()],
            "{dtype:?} {red:?}: acc {:02x?} input {:02x?}",
            &acc[r.clone()],
            &input[r]
        );
    }
}

#[test]
fn copy_moves_every_byte_at_any_alignment() {
    let mut rng = Rng(11);
    // Ends agreeing modulo 16, 8, 4 or nothing, at every offset in a word,
    // and lengths that end anywhere in one.
    let cases = (0..16).flat_map(|src_off| {
        [0, 1, 4, 8, 15].into_iter().flat_map(move |dst_off| {
            [0, 1, 15, 16, 17, 64, 333, 4099]
                .into_iter()
                .map(move |len| (src_off, dst_off, len))
        })
    });
    for (src_off, dst_off, len) in cases {
        let mut src = Aligned::new(len + src_off);
        let mut dst = Aligned::new(len + dst_off);
        for b in src.bytes(src_off, len) {
            *b = rng.next() as u8;
        }
        let expect = src.bytes(src_off, len).to_vec();
        // SAFETY: both ranges are inside their buffers and disjoint.
        unsafe { twin::copy(dst.ptr(dst_off).cast(), src.ptr(src_off).cast(), len as u64) };
        assert_eq!(
            dst.bytes(dst_off, len),
            &expect[..],
            "from {src_off} to {dst_off}, {len} bytes"
        );
    }
}

/// FIFO memory both the host FIFO and the twin use.
struct Shared(Arc<HeapMemory>);

impl FifoMemory for Shared {
    fn base(&self) -> *mut u8 {
        self.0.base()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

fn fifo_pair(protocol: Protocol, nslots: usize, slot_bytes: usize) -> (Fifo, FifoView) {
    let mem = Arc::new(HeapMemory::new(fifo_bytes(protocol, nslots, slot_bytes)));
    let view = FifoView::whole(mem.base(), protocol.abi(), nslots as u32, slot_bytes as u32);
    let fifo = Fifo::in_memory(Arc::new(Shared(mem)), protocol, nslots, slot_bytes);
    (fifo, view)
}

fn piece(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    (0..len).map(|_| rng.next() as u8).collect()
}

#[test]
fn twin_slots_read_by_the_host_fifo_and_back_for_every_protocol() {
    for protocol in Protocol::ALL {
        for slot_bytes in [8, 240, 256, 1000] {
            let nslots = 4;
            let (fifo, view) = fifo_pair(protocol, nslots, slot_bytes);
            let lens: Vec<usize> = [0, 1, 3, 4, 5, 8, 119, 120, 121, 239, 240, 241, 999, 1000]
                .into_iter()
                .filter(|&l| l <= slot_bytes)
                .collect();
            // Enough pieces that the counters wrap around the slots.
            for (k, &len) in lens
                .iter()
                .cycle()
                .take(3 * nslots + lens.len())
                .enumerate()
            {
                let k = k as u32;
                let tag = [k, 0xc0de, 77 + k];
                // Twin to host.
                let sent = piece(len, u64::from(k) + 1);
                // SAFETY: `view` describes the FIFO's zeroed memory; this
                // thread is its only producer and consumer.
                assert!(
                    unsafe { twin::fifo_send(&view, &sent, tag) },
                    "{protocol:?} send {k}"
                );
                let (at, got_len, got_tag) = fifo.try_peek().expect("host sees the twin's piece");
                assert_eq!(
                    (got_len, got_tag),
                    (
                        len,
                        Tag {
                            seq: k,
                            call: 0xc0de,
                            count: 77 + k
                        }
                    )
                );
                // SAFETY: the peeked piece stays valid until `release`.
                assert_eq!(
                    unsafe { std::slice::from_raw_parts(at, got_len) },
                    &sent[..]
                );
                fifo.release();
                // Host to twin.
                let back = piece(len, u64::from(k) + 1000);
                let slot = fifo.try_reserve().expect("free slot");
                // SAFETY: the reserved slot holds `slot_bytes >= len` bytes.
                unsafe { std::ptr::copy_nonoverlapping(back.as_ptr(), slot, len) };
                fifo.publish(
                    len,
                    Tag {
                        seq: k,
                        call: 5,
                        count: 6,
                    },
                );
                let mut out = vec![0u8; slot_bytes];
                // SAFETY: as above.
                let (n, t) = unsafe { twin::fifo_recv(&view, &mut out) }.unwrap_or_else(|| {
                    panic!("{protocol:?} slot {slot_bytes}: twin reads piece {k} of {len}")
                });
                assert_eq!((n, t), (len, [k, 5, 6]), "{protocol:?} piece {k}");
                assert_eq!(&out[..n], &back[..]);
            }
        }
    }
}

/// Pieces sent from and received into buffers at every offset inside a
/// 16-byte word, of lengths that end anywhere in one (the unaligned head
/// and tail of each move apart from its vector body), cross the host FIFO
/// unchanged for every protocol.
#[test]
fn twin_moves_unaligned_pieces_through_every_protocol() {
    for protocol in Protocol::ALL {
        let slot_bytes = 1000;
        let (fifo, view) = fifo_pair(protocol, 4, slot_bytes);
        let mut k = 0u32;
        for offset in [0, 1, 3, 8, 13, 15] {
            for len in [0, 1, 15, 17, 119, 121, 255, 999] {
                let data = piece(len, u64::from(k) + 7);
                let mut src = Aligned::new(len + offset);
                src.bytes(offset, len).copy_from_slice(&data);
                // SAFETY: `view` describes the FIFO's memory; this thread
                // is its only producer and consumer; the source holds
                // `len` bytes.
                let sent = unsafe {
                    twin::fifo_send(
                        &view,
                        std::slice::from_raw_parts(src.ptr(offset), len),
                        [k, 1, 2],
                    )
                };
                assert!(sent, "{protocol:?} send {k}");
                let (at, got_len, _) = fifo.try_peek().expect("host sees the twin's piece");
                // SAFETY: the peeked piece stays valid until `release`.
                let got = unsafe { std::slice::from_raw_parts(at, got_len) };
                assert_eq!(got, &data[..], "{protocol:?} offset {offset} len {len}");
                fifo.release();
                let slot = fifo.try_reserve().expect("free slot");
                // SAFETY: the reserved slot holds `slot_bytes >= len` bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), slot, len) };
                fifo.publish(
                    len,
                    Tag {
                        seq: k,
                        call: 3,
                        count: 4,
                    },
                );
                let mut out = Aligned::new(slot_bytes + offset);
                // SAFETY: as above; the destination holds `slot_bytes`.
                let (n, _) = unsafe {
                    twin::fifo_recv(
                        &view,
                        std::slice::from_raw_parts_mut(out.ptr(offset), slot_bytes),
                    )
                }
                .unwrap_or_else(|| panic!("{protocol:?} twin reads piece {k}"));
                assert_eq!(
                    out.bytes(offset, n),
                    &data[..],
                    "{protocol:?} into offset {offset} len {len}"
                );
                k += 1;
            }
        }
    }
}

#[test]
fn twin_waits_for_slots_and_for_flags() {
    for protocol in Protocol::ALL {
        let (fifo, view) = fifo_pair(protocol, 2, 256);
        let mut out = vec![0u8; 256];
        // Nothing published: nothing to receive.
        // SAFETY: as in the round-trip test.
        assert!(unsafe { twin::fifo_recv(&view, &mut out) }.is_none());
        // Two slots: the third send waits for the consumer.
        for k in 0..2 {
            // SAFETY: as above.
            assert!(unsafe { twin::fifo_send(&view, &piece(200, k + 1), [k as u32, 0, 0]) });
        }
        // SAFETY: as above.
        assert!(!unsafe { twin::fifo_send(&view, &piece(200, 9), [2, 0, 0]) });
        fifo.try_peek().expect("first piece");
        fifo.release();
        // SAFETY: as above.
        assert!(unsafe { twin::fifo_send(&view, &piece(200, 9), [2, 0, 0]) });
        if protocol == Protocol::Simple {
            continue;
        }
        // A word (LL) or a line (LL128) whose flag has not arrived keeps
        // the whole piece unseen.
        let (fifo, view) = fifo_pair(protocol, 2, 256);
        let slot = fifo.try_reserve().expect("slot");
        // SAFETY: the slot holds 256 bytes.
        unsafe { std::ptr::write_bytes(slot, 0xab, 200) };
        fifo.publish(200, Tag::default());
        let flag_at = match protocol {
            // The last payload word's flag: header words, then 50 words.
            Protocol::Ll => 4096 + (4 + 49) * 8 + 4,
            // The second payload line's flag.
            _ => 4096 + 2 * 128 + 120,
        };
        // SAFETY: the offset lies inside the FIFO's first slot.
        let flag = unsafe { view.base.add(flag_at) };
        // SAFETY: as above; nobody else touches the FIFO now.
        let saved = unsafe { flag.read() };
        unsafe { flag.write(saved ^ 0xff) };
        // SAFETY: as in the round-trip test.
        assert!(
            unsafe { twin::fifo_recv(&view, &mut out) }.is_none(),
            "{protocol:?}"
        );
        // SAFETY: as above.
        unsafe { flag.write(saved) };
        // SAFETY: as above.
        let (n, _) = unsafe { twin::fifo_recv(&view, &mut out) }.expect("complete now");
        assert_eq!(&out[..n], &[0xab; 200][..]);
    }
}
