// Element-wise reductions for every NCCL datatype and operator, bitwise
// identical to rccl's host kernels (rccl-rs/src/kernels):
//
// - integers wrap (two's complement); integer Avg sums and divides by the
//   rank count when the result is final, truncating toward zero;
// - float Avg multiplies each input by 1/nranks (f32 for types up to 32
//   bits, f64 for f64), then sums; PreMulSum multiplies each input by its
//   scalar (decoded from the datatype's own encoding), then sums; a scalar
//   of exactly one is skipped;
// - fp16, bf16 and both fp8 types compute in f32 and round back to
//   nearest-even after each step (fp8 e4m3 saturates to +-448, e5m2
//   overflows to infinity, every fp8 NaN is 0x7f with its sign);
// - float Max / Min propagate NaN and return the accumulator on ties;
// - a NaN result carries the payload x86 gives: the NaN operand, made
//   quiet, or the negative default NaN when the operation creates one
//   (inf - inf, 0 * inf). GPUs return a canonical NaN instead; these
//   functions pick the payload explicitly so both builds agree with the
//   host bit for bit. When both operands are NaN, x86 returns the first
//   source operand, and which one that is depends on how the compiler
//   ordered them; here it is the accumulator. Only there (a NaN from two
//   NaNs) may the host's result differ, and only in the NaN's sign and
//   payload.
//
// Compiled with contraction off (nvcc -fmad=false, g++ -ffp-contract=off)
// and without flushing denormals: each operation is rounded on its own.
#pragma once

#include "move.h"
#include "port.h"

namespace rccl {

// ncclDataType_t values.
enum DataType : int32_t {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
  kNumTypes = 12,
};

// ncclRedOp_t values of the built-in operators, then PreMulSum.
enum RedOp : int32_t {
  kOpSum = 0,
  kOpProd = 1,
  kOpMax = 2,
  kOpMin = 3,
  kOpAvg = 4,
  kOpPreMulSum = 5,
};

enum Combine : int32_t { kSum = 0, kProd = 1, kMax = 2, kMin = 3 };

// One reduction over `count` elements: out = acc OP pre(input), or
// out = pre(input) when acc is null; the output transform (integer Avg)
// applies when `finish` is set. Mirrored by `ReduceArgs` in Rust.
struct ReduceArgs {
  const void* acc;
  const void* input;
  void* out;
  uint64_t count;
  // Rank count, for Avg.
  uint64_t nranks;
  // PreMulSum's scalar in the datatype's encoding, little-endian; read from
  // `scalar_ptr` instead when that is not null (a device scalar).
  uint64_t scalar;
  const void* scalar_ptr;
  int32_t dtype;
  int32_t op;
  int32_t finish;
  // The input is a partial result, already transformed on its way in: no
  // input transform (PreMulSum and float Avg combine as Sum).
  int32_t partial;
};

// ---- floating-point helpers ----

RCCL_HD bool f32_is_nan(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }
RCCL_HD bool f64_is_nan(uint64_t b) {
  return (b & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
}

// The NaN x86 returns for an operation that produced NaN from a and b.
RCCL_HD float f32_nan_of(float a, float b) {
  uint32_t x = f32_bits(a), y = f32_bits(b);
  if (f32_is_nan(x)) return f32_from(x | 0x00400000u);
  if (f32_is_nan(y)) return f32_from(y | 0x00400000u);
  return f32_from(0xffc00000u);
}
RCCL_HD double f64_nan_of(double a, double b) {
  uint64_t x = f64_bits(a), y = f64_bits(b);
  if (f64_is_nan(x)) return f64_from(x | 0x0008000000000000ull);
  if (f64_is_nan(y)) return f64_from(y | 0x0008000000000000ull);
  return f64_from(0xfff8000000000000ull);
}

RCCL_HD float f32_add(float a, float b) {
  float r = a + b;
  return r != r ? f32_nan_of(a, b) : r;
}
RCCL_HD float f32_mul(float a, float b) {
  float r = a * b;
  return r != r ? f32_nan_of(a, b) : r;
}
RCCL_HD double f64_add(double a, double b) {
  double r = a + b;
  return r != r ? f64_nan_of(a, b) : r;
}
RCCL_HD double f64_mul(double a, double b) {
  double r = a * b;
  return r != r ? f64_nan_of(a, b) : r;
}

// ---- narrow formats <-> f32 ----

// bfloat16: the high half of an f32; rounding adds 0x7fff plus the lowest
// kept bit (a carry into the exponent is the correct result).
RCCL_HD float bf16_to_f32(uint16_t c) { return f32_from(uint32_t(c) << 16); }
RCCL_HD uint16_t f32_to_bf16(float x) {
  uint32_t bits = f32_bits(x);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40u);
  return uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

// IEEE binary16, as the half crate converts (F16C gives the same bits).
RCCL_HD float f16_to_f32(uint16_t i) {
  if ((i & 0x7fffu) == 0) return f32_from(uint32_t(i) << 16);
  uint32_t sign = uint32_t(i & 0x8000u) << 16;
  uint32_t exp = i & 0x7c00u;
  uint32_t man = i & 0x03ffu;
  if (exp == 0x7c00u) {
    return man == 0 ? f32_from(sign | 0x7f800000u) : f32_from(sign | 0x7fc00000u | (man << 13));
  }
  if (exp == 0) {
    // Subnormal: normalize on the mantissa's top bit.
    int e = clz32(man) - 16 - 6;
    uint32_t fexp = uint32_t(127 - 15 - e) << 23;
    uint32_t fman = (man << (14 + e)) & 0x7fffffu;
    return f32_from(sign | fexp | fman);
  }
  uint32_t fexp = uint32_t(int32_t(exp >> 10) - 15 + 127) << 23;
  return f32_from(sign | fexp | (man << 13));
}
RCCL_HD uint16_t f32_to_f16(float value) {
  uint32_t x = f32_bits(value);
  uint32_t sign = x & 0x80000000u;
  uint32_t exp = x & 0x7f800000u;
  uint32_t man = x & 0x007fffffu;
  if (exp == 0x7f800000u) {
    uint32_t nan_bit = man == 0 ? 0 : 0x0200u;
    return uint16_t((sign >> 16) | 0x7c00u | nan_bit | (man >> 13));
  }
  uint32_t half_sign = sign >> 16;
  int32_t half_exp = int32_t(exp >> 23) - 127 + 15;
  if (half_exp >= 0x1f) return uint16_t(half_sign | 0x7c00u);
  if (half_exp <= 0) {
    if (14 - half_exp > 24) return uint16_t(half_sign);
    uint32_t m = man | 0x00800000u;
    uint32_t half_man = m >> (14 - half_exp);
    uint32_t round_bit = 1u << (13 - half_exp);
    if ((m & round_bit) != 0 && (m & (3 * round_bit - 1)) != 0) half_man += 1;
    return uint16_t(half_sign | half_man);
  }
  uint32_t bits = half_sign | (uint32_t(half_exp) << 10) | (man >> 13);
  uint32_t round_bit = 0x1000u;
  if ((man & round_bit) != 0 && (man & (3 * round_bit - 1)) != 0) bits += 1;
  return uint16_t(bits);
}

// fp8 e4m3 ("fn": no infinities, NaN = 0x7f / 0xff).
RCCL_HD float e4m3_to_f32(uint8_t code) {
  uint32_t c = code;
  uint32_t sign = (c & 0x80u) << 24;
  uint32_t mag = c & 0x7fu;
  float v;
  if (mag == 0x7fu) {
    v = f32_from(0x7fc00000u);
  } else if (mag >= 0x08u) {
    v = f32_from((mag << 20) + (120u << 23));
  } else {
    v = float(mag) * (1.0f / 512.0f);
  }
  return f32_from(f32_bits(v) | sign);
}
// Round to nearest-even, saturating to +-448 (infinities included).
RCCL_HD uint8_t f32_to_e4m3(float x) {
  uint32_t bits = f32_bits(x);
  uint32_t sign = (bits >> 24) & 0x80u;
  uint32_t abs = bits & 0x7fffffffu;
  uint32_t clamped = abs < 0x43e00000u ? abs : 0x43e00000u;
  uint32_t mag;
  if (abs > 0x7f800000u) {
    mag = 0x7fu;
  } else if (clamped < 0x3c800000u) {
    // Subnormal result: adding 2^14 (ulp 2^-9) rounds to a multiple of 2^-9.
    mag = f32_bits(f32_from(clamped) + 16384.0f) - 0x46800000u;
  } else {
    mag = ((clamped + 0x7ffffu + ((clamped >> 20) & 1u)) >> 20) - (120u << 3);
  }
  return uint8_t(mag | sign);
}

// fp8 e5m2 (IEEE-like: infinities, NaN).
RCCL_HD float e5m2_to_f32(uint8_t code) {
  uint32_t c = code;
  uint32_t sign = (c & 0x80u) << 24;
  uint32_t mag = c & 0x7fu;
  float v;
  if (mag >= 0x7cu) {
    v = f32_from(0x7f800000u | ((mag & 3u) << 21));
  } else if (mag >= 0x04u) {
    v = f32_from((mag << 21) + (112u << 23));
  } else {
    v = float(mag) * (1.0f / 65536.0f);
  }
  return f32_from(f32_bits(v) | sign);
}
// Round to nearest-even, overflowing to +-inf.
RCCL_HD uint8_t f32_to_e5m2(float x) {
  uint32_t bits = f32_bits(x);
  uint32_t sign = (bits >> 24) & 0x80u;
  uint32_t abs = bits & 0x7fffffffu;
  uint32_t clamped = abs < 0x47800000u ? abs : 0x47800000u;
  uint32_t mag;
  if (abs > 0x7f800000u) {
    mag = 0x7fu;
  } else if (clamped < 0x38800000u) {
    mag = f32_bits(f32_from(clamped) + 128.0f) - 0x43000000u;
  } else {
    mag = ((clamped + 0xfffffu + ((clamped >> 21) & 1u)) >> 21) - (112u << 2);
  }
  return uint8_t(mag | sign);
}

// ---- element arithmetic per storage type ----
//
// Each type: T (storage), S (the input transform's scalar), add, mul, max,
// min (the accumulator `a` on ties), div (integer Avg; kDivides says
// whether it does anything), scale.

template <class T, class U>
struct IntOps {
  typedef T Elem;
  typedef T Scale;
  static constexpr bool kDivides = true;
  RCCL_HD static T add(T a, T b) { return T(U(U(a) + U(b))); }
  RCCL_HD static T mul(T a, T b) { return T(U(U(a) * U(b))); }
  RCCL_HD static T max(T a, T b) { return a < b ? b : a; }
  RCCL_HD static T min(T a, T b) { return b < a ? b : a; }
  RCCL_HD static T scale(T x, T s) { return mul(x, s); }
};

// x / n (n >= 1) truncated toward zero, for x of at most 32 bits: in
// 32-bit arithmetic, which the GPU divides inline (64-bit division is a
// called routine, and the values live across its calls would spill).
RCCL_HD int32_t div_i32(int32_t x, uint64_t n) {
  // |x| <= 2^31 <= n: only -2^31 / 2^31 is not zero.
  if (n >= (1ull << 31)) return (x == INT32_MIN && n == (1ull << 31)) ? -1 : 0;
  return x / int32_t(n);
}
RCCL_HD uint32_t div_u32(uint32_t x, uint64_t n) { return n > UINT32_MAX ? 0 : x / uint32_t(n); }

struct I8Ops : IntOps<int8_t, uint32_t> {
  RCCL_HD static int8_t div(int8_t x, uint64_t n) { return int8_t(div_i32(x, n)); }
};
struct U8Ops : IntOps<uint8_t, uint32_t> {
  RCCL_HD static uint8_t div(uint8_t x, uint64_t n) { return uint8_t(div_u32(x, n)); }
};
struct I32Ops : IntOps<int32_t, uint32_t> {
  RCCL_HD static int32_t div(int32_t x, uint64_t n) { return div_i32(x, n); }
};
struct U32Ops : IntOps<uint32_t, uint32_t> {
  RCCL_HD static uint32_t div(uint32_t x, uint64_t n) { return div_u32(x, n); }
};
struct I64Ops : IntOps<int64_t, uint64_t> {
  // The magnitude divided unsigned, negated back: the same truncation
  // toward zero (|-2^63| fits the unsigned type), and the GPU's 64-bit
  // unsigned routine needs fewer values kept across its call than the
  // signed one (which spilled).
  RCCL_HD static int64_t div(int64_t x, uint64_t n) {
    uint64_t q = (x < 0 ? 0ull - uint64_t(x) : uint64_t(x)) / n;
    return int64_t(x < 0 ? 0ull - q : q);
  }
};
struct U64Ops : IntOps<uint64_t, uint64_t> {
  RCCL_HD static uint64_t div(uint64_t x, uint64_t n) { return x / n; }
};

struct F32Ops {
  typedef float Elem;
  typedef float Scale;
  static constexpr bool kDivides = false;
  RCCL_HD static float add(float a, float b) { return f32_add(a, b); }
  RCCL_HD static float mul(float a, float b) { return f32_mul(a, b); }
  RCCL_HD static float max(float a, float b) { return (a != a || a > b) ? a : b; }
  RCCL_HD static float min(float a, float b) { return (a != a || a < b) ? a : b; }
  RCCL_HD static float div(float x, uint64_t) { return x; }
  RCCL_HD static float scale(float x, float s) { return f32_mul(x, s); }
};

struct F64Ops {
  typedef double Elem;
  typedef double Scale;
  static constexpr bool kDivides = false;
  RCCL_HD static double add(double a, double b) { return f64_add(a, b); }
  RCCL_HD static double mul(double a, double b) { return f64_mul(a, b); }
  RCCL_HD static double max(double a, double b) { return (a != a || a > b) ? a : b; }
  RCCL_HD static double min(double a, double b) { return (a != a || a < b) ? a : b; }
  RCCL_HD static double div(double x, uint64_t) { return x; }
  RCCL_HD static double scale(double x, double s) { return f64_mul(x, s); }
};

// Narrow floats computed in f32. `kEncodeExtrema`: Max / Min re-encode the
// f32 result (fp16, whose host loop converts whole chunks) instead of
// returning an operand unchanged (bf16, fp8).
template <class T, float (*Dec)(T), T (*Enc)(float), bool kEncodeExtrema>
struct NarrowOps {
  typedef T Elem;
  typedef float Scale;
  static constexpr bool kDivides = false;
  RCCL_HD static T add(T a, T b) { return Enc(f32_add(Dec(a), Dec(b))); }
  RCCL_HD static T mul(T a, T b) { return Enc(f32_mul(Dec(a), Dec(b))); }
  RCCL_HD static T max(T a, T b) {
    float x = Dec(a), y = Dec(b);
    bool first = x != x || x > y;
    if (kEncodeExtrema) return Enc(first ? x : y);
    return first ? a : b;
  }
  RCCL_HD static T min(T a, T b) {
    float x = Dec(a), y = Dec(b);
    bool first = x != x || x < y;
    if (kEncodeExtrema) return Enc(first ? x : y);
    return first ? a : b;
  }
  RCCL_HD static T div(T x, uint64_t) { return x; }
  RCCL_HD static T scale(T x, float s) { return Enc(f32_mul(Dec(x), s)); }
};

typedef NarrowOps<uint16_t, f16_to_f32, f32_to_f16, true> F16Ops;
typedef NarrowOps<uint16_t, bf16_to_f32, f32_to_bf16, false> Bf16Ops;
typedef NarrowOps<uint8_t, e4m3_to_f32, f32_to_e4m3, false> E4m3Ops;
typedef NarrowOps<uint8_t, e5m2_to_f32, f32_to_e5m2, false> E5m2Ops;

// ---- preparing a call: what ReduceKernel::new decides ----

struct Prepared {
  int32_t combine;
  bool has_pre;
  bool pre_is_int;
  uint64_t pre_int;   // sign-extended two's complement
  double pre_float;   // exact in the compute type
  bool has_post;
  uint64_t post_div;
};

RCCL_HD bool is_float(int32_t dtype) { return dtype >= kFloat16; }

RCCL_HD uint32_t type_size(int32_t dtype) {
  switch (dtype) {
    case kInt8: case kUint8: case kFloat8e4m3: case kFloat8e5m2: return 1;
    case kFloat16: case kBfloat16: return 2;
    case kInt32: case kUint32: case kFloat32: return 4;
    default: return 8;
  }
}

// The scalar as the host decodes it: integers sign- or zero-extended;
// floats through f64 into the compute type, which quiets a NaN.
RCCL_HD void decode_scalar(int32_t dtype, uint64_t raw, Prepared* p) {
  p->pre_is_int = !is_float(dtype);
  switch (dtype) {
    case kInt8: p->pre_int = uint64_t(int64_t(int8_t(raw & 0xff))); return;
    case kUint8: p->pre_int = raw & 0xff; return;
    case kInt32: p->pre_int = uint64_t(int64_t(int32_t(raw & 0xffffffffu))); return;
    case kUint32: p->pre_int = raw & 0xffffffffu; return;
    case kInt64: case kUint64: p->pre_int = raw; return;
    case kFloat64: p->pre_float = f64_from(raw); return;
    default: break;
  }
  float f;
  switch (dtype) {
    case kFloat16: f = f16_to_f32(uint16_t(raw)); break;
    case kBfloat16: f = bf16_to_f32(uint16_t(raw)); break;
    case kFloat8e4m3: f = e4m3_to_f32(uint8_t(raw)); break;
    case kFloat8e5m2: f = e5m2_to_f32(uint8_t(raw)); break;
    default: f = f32_from(uint32_t(raw)); break;
  }
  uint32_t b = f32_bits(f);
  if (f32_is_nan(b)) f = f32_from(b | 0x00400000u);
  p->pre_float = double(f);
}

RCCL_HD Prepared prepare(int32_t dtype, int32_t op, uint64_t nranks, uint64_t scalar) {
  Prepared p;
  p.combine = kSum;
  p.has_pre = false;
  p.pre_is_int = false;
  p.pre_int = 0;
  p.pre_float = 0.0;
  p.has_post = false;
  p.post_div = 1;
  switch (op) {
    case kOpProd: p.combine = kProd; break;
    case kOpMax: p.combine = kMax; break;
    case kOpMin: p.combine = kMin; break;
    case kOpAvg:
      if (is_float(dtype)) {
        p.has_pre = true;
        p.pre_float = dtype == kFloat64 ? 1.0 / double(nranks)
                                        : double(1.0f / float(nranks));
      } else {
        p.has_post = true;
        p.post_div = nranks;
      }
      break;
    case kOpPreMulSum:
      p.has_pre = true;
      decode_scalar(dtype, scalar, &p);
      break;
    default: break;
  }
  // Multiplying by one is the identity (up to NaN payloads): skipped.
  if (p.has_pre && (p.pre_is_int ? p.pre_int == 1 : p.pre_float == 1.0)) p.has_pre = false;
  if (p.has_post && p.post_div == 1) p.has_post = false;
  return p;
}

template <class Ops>
RCCL_HD typename Ops::Scale scale_of(const Prepared& p) {
  typedef typename Ops::Scale S;
  return p.pre_is_int ? S(int64_t(p.pre_int)) : S(p.pre_float);
}

// One element: the combine, with the input transform first and the output
// transform (integer Avg's division, kPost) last.
template <class Ops, int kCombine, bool kAcc, bool kPost>
RCCL_HD typename Ops::Elem reduce_elem(typename Ops::Elem a, typename Ops::Elem b, bool pre,
                                       typename Ops::Scale s, uint64_t n) {
  typedef typename Ops::Elem T;
  if (kCombine == kSum) {
    if (pre) b = Ops::scale(b, s);
    T r = kAcc ? Ops::add(a, b) : b;
    return kPost ? Ops::div(r, n) : r;
  }
  if (kCombine == kProd) return Ops::mul(a, b);
  if (kCombine == kMax) return Ops::max(a, b);
  return Ops::min(a, b);
}

// ---- the loops ----

// 16 bytes of elements, moved by one vector access.
template <class T>
union Pack16 {
  Vec16 v;
  T e[16 / sizeof(T)];
};

template <class T>
RCCL_HD Pack16<T> load16(const unsigned char* p) {
  Pack16<T> r;
  r.v = load_word<16>(p);
  return r;
}
template <class T>
RCCL_HD void store16(unsigned char* p, const Pack16<T>& r) {
  store_word<16>(p, r.v);
}

// One element at any address: a single access when it is aligned (the
// GPU would otherwise move it byte by byte).
template <class T>
RCCL_HD T load_elem(const unsigned char* p) {
  T v;
#if RCCL_ON_DEVICE
  if (uintptr_t(p) % sizeof(T) == 0) return *reinterpret_cast<const T*>(p);
#endif
  __builtin_memcpy(&v, p, sizeof(T));
  return v;
}
template <class T>
RCCL_HD void store_elem(unsigned char* p, T v) {
#if RCCL_ON_DEVICE
  if (uintptr_t(p) % sizeof(T) == 0) {
    *reinterpret_cast<T*>(p) = v;
    return;
  }
#endif
  __builtin_memcpy(p, &v, sizeof(T));
}

// Where the 16-byte body of a reduction of n elements starts: at the
// output's first 16-byte boundary when every end shares its address
// modulo 16 and elements fit that alignment; otherwise there is no body
// (n). The body loop and the edge call both work it out from the
// pointers, so the split is not passed to the call.
template <class T, bool kAcc>
RCCL_HD uint64_t body_head(const unsigned char* A, const unsigned char* B, const unsigned char* O,
                           uint64_t n) {
  const uintptr_t differ =
      (uintptr_t(B) ^ uintptr_t(O)) | (kAcc ? uintptr_t(A) ^ uintptr_t(O) : 0);
  const uint64_t skew = (16 - uintptr_t(O) % 16) % 16;
  if (differ % 16 != 0 || skew % sizeof(T) != 0) return n;
  return skew / sizeof(T) < n ? skew / sizeof(T) : n;
}

// The elements around the body, one at a time: the unaligned ends, both
// in one call after the body, so no value of the caller lives across it.
template <class Ops, int kCombine, bool kAcc, bool kPost>
RCCL_NARROW void reduce_edge(const unsigned char* A, const unsigned char* B, unsigned char* O,
                             uint64_t n, bool pre, typename Ops::Scale s, uint64_t div,
                             uint64_t thread, uint64_t threads) {
  typedef typename Ops::Elem T;
  constexpr uint64_t E = 16 / sizeof(T);
  const uint64_t head = body_head<T, kAcc>(A, B, O, n);
  const uint64_t tail = head + (n - head) / E * E;
  const uint64_t count = head + (n - tail);
  RCCL_NO_UNROLL
  for (uint64_t k = thread; k < count; k += threads) {
    const uint64_t i = k < head ? k : tail + (k - head);
    const T a = kAcc ? load_elem<T>(A + i * sizeof(T)) : T(0);
    const T b = load_elem<T>(B + i * sizeof(T));
    store_elem<T>(O + i * sizeof(T), reduce_elem<Ops, kCombine, kAcc, kPost>(a, b, pre, s, div));
  }
}

// This thread's share of the reduction: the body's 16-byte packs (kUnroll
// per round, loads before stores, for memory-level parallelism), then the
// edges. Output identical to an input is fine: each element is read
// before it is written, by the same thread.
template <class Ops, int kCombine, bool kAcc, bool kPost>
RCCL_HD void reduce_threads(const ReduceArgs& args, const Prepared& p, uint64_t thread,
                            uint64_t threads) {
  typedef typename Ops::Elem T;
  constexpr uint64_t E = 16 / sizeof(T);
  const unsigned char* A = static_cast<const unsigned char*>(args.acc);
  const unsigned char* B = static_cast<const unsigned char*>(args.input);
  unsigned char* O = static_cast<unsigned char*>(args.out);
  const uint64_t n = args.count;
  const typename Ops::Scale s = scale_of<Ops>(p);
  const bool pre = p.has_pre;
  const uint64_t div = p.post_div;
  const uint64_t head = body_head<T, kAcc>(A, B, O, n);
  const uint64_t packs = (n - head) / E;
  const unsigned char* VA = kAcc ? A + head * sizeof(T) : nullptr;
  const unsigned char* VB = B + head * sizeof(T);
  unsigned char* VO = O + head * sizeof(T);
  uint64_t i = thread;
  for (; i + (kUnroll - 1) * threads < packs; i += kUnroll * threads) {
    Pack16<T> a[kUnroll], b[kUnroll];
RCCL_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
      b[u] = load16<T>(VB + (i + u * threads) * 16);
      if (kAcc) a[u] = load16<T>(VA + (i + u * threads) * 16);
    }
RCCL_UNROLL
    for (int u = 0; u < kUnroll; ++u) {
RCCL_UNROLL
      for (uint64_t k = 0; k < E; ++k)
        b[u].e[k] = reduce_elem<Ops, kCombine, kAcc, kPost>(kAcc ? a[u].e[k] : T(0), b[u].e[k],
                                                            pre, s, div);
      store16<T>(VO + (i + u * threads) * 16, b[u]);
    }
  }
  for (; i < packs; i += threads) {
    Pack16<T> b = load16<T>(VB + i * 16);
    Pack16<T> a;
    if (kAcc) a = load16<T>(VA + i * 16);
RCCL_UNROLL
    for (uint64_t k = 0; k < E; ++k)
      b.e[k] = reduce_elem<Ops, kCombine, kAcc, kPost>(kAcc ? a.e[k] : T(0), b.e[k], pre, s, div);
    store16<T>(VO + i * 16, b);
  }
  reduce_edge<Ops, kCombine, kAcc, kPost>(A, B, O, n, pre, s, div, thread, threads);
}

// A sum, with integer Avg's division in a loop of its own, so that the
// other sums do not carry the division's registers.
template <class Ops, bool kAcc>
RCCL_HD void reduce_sum(const ReduceArgs& args, const Prepared& p, uint64_t thread,
                        uint64_t threads) {
  if (Ops::kDivides && p.has_post && args.finish)
    reduce_threads<Ops, kSum, kAcc, Ops::kDivides>(args, p, thread, threads);
  else
    reduce_threads<Ops, kSum, kAcc, false>(args, p, thread, threads);
}

// The reduction of `args` for datatype Ops, this thread's share of it.
template <class Ops>
RCCL_HD void reduce_typed(const ReduceArgs& args, const Prepared& p, uint64_t thread,
                          uint64_t threads) {
  const bool acc = args.acc != nullptr;
  if (!acc && !p.has_pre && !(p.has_post && args.finish)) {
    if (args.input != args.out)
      copy_bytes(args.out, args.input, args.count * sizeof(typename Ops::Elem), thread, threads);
    return;
  }
  if (!acc) {
    // Without an accumulator only Sum's transforms apply (Prod, Max and
    // Min carry none, so they were the copy above).
    reduce_sum<Ops, false>(args, p, thread, threads);
    return;
  }
  switch (p.combine) {
    case kSum: reduce_sum<Ops, true>(args, p, thread, threads); break;
    case kProd: reduce_threads<Ops, kProd, true, false>(args, p, thread, threads); break;
    case kMax: reduce_threads<Ops, kMax, true, false>(args, p, thread, threads); break;
    default: reduce_threads<Ops, kMin, true, false>(args, p, thread, threads); break;
  }
}

// The device scalar: one element of the datatype, read whole into a
// register.
RCCL_NARROW uint64_t read_scalar_edge(const void* at, uint32_t size) {
  const unsigned char* p = static_cast<const unsigned char*>(at);
  switch (size) {
    case 1: return load_elem<uint8_t>(p);
    case 2: return load_elem<uint16_t>(p);
    case 4: return load_elem<uint32_t>(p);
    default: return load_elem<uint64_t>(p);
  }
}

// The scalar the call uses: the device scalar when given, else the host's.
RCCL_HD uint64_t scalar_of(const ReduceArgs& args) {
  if (args.scalar_ptr == nullptr) return args.scalar;
  return read_scalar_edge(args.scalar_ptr, type_size(args.dtype));
}

template <class Ops>
RCCL_HD void reduce_for(const ReduceArgs& args, uint64_t thread, uint64_t threads) {
  Prepared p = prepare(args.dtype, args.op, args.nranks, scalar_of(args));
  if (args.partial) p.has_pre = false;
  reduce_typed<Ops>(args, p, thread, threads);
}

// Every datatype, by the datatype's value (the host twin's entry; the
// kernels instantiate one datatype each).
RCCL_HD void reduce_any(const ReduceArgs& args, uint64_t thread, uint64_t threads) {
  switch (args.dtype) {
    case kInt8: reduce_for<I8Ops>(args, thread, threads); break;
    case kUint8: reduce_for<U8Ops>(args, thread, threads); break;
    case kInt32: reduce_for<I32Ops>(args, thread, threads); break;
    case kUint32: reduce_for<U32Ops>(args, thread, threads); break;
    case kInt64: reduce_for<I64Ops>(args, thread, threads); break;
    case kUint64: reduce_for<U64Ops>(args, thread, threads); break;
    case kFloat16: reduce_for<F16Ops>(args, thread, threads); break;
    case kFloat32: reduce_for<F32Ops>(args, thread, threads); break;
    case kFloat64: reduce_for<F64Ops>(args, thread, threads); break;
    case kBfloat16: reduce_for<Bf16Ops>(args, thread, threads); break;
    case kFloat8e4m3: reduce_for<E4m3Ops>(args, thread, threads); break;
    case kFloat8e5m2: reduce_for<E5m2Ops>(args, thread, threads); break;
    default: break;
  }
}

}  // namespace rccl
