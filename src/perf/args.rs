//! Command-line flags, with nccl-tests' letters, long names and defaults.

use clap::Parser;
use rccl::{DataType, RedOp};

/// Parses a size as nccl-tests does: a number with an optional K, M or G
/// suffix (powers of 1024, either case); fractions are allowed ("1.5M").
pub fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("invalid size {text:?}"))?;
    let units = match unit.trim() {
        "" => 1.0,
        u if u.len() == 1 => match u {
            "G" | "g" => 1024.0 * 1024.0 * 1024.0,
            "M" | "m" => 1024.0 * 1024.0,
            "K" | "k" => 1024.0,
            _ => return Err(format!("invalid size {text:?}")),
        },
        _ => return Err(format!("invalid size {text:?}")),
    };
    if value < 0.0 || !value.is_finite() {
        return Err(format!("invalid size {text:?}"));
    }
    Ok((value * units) as usize)
}

/// An integer as C's `strtol(text, NULL, 0)` reads it (decimal, 0x hex or
/// leading-0 octal).
fn parse_int(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (neg, t) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let v = if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(hex, 16)
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8)
    } else {
        t.parse()
    }
    .map_err(|_| format!("invalid number {text:?}"))?;
    Ok(if neg { -v } else { v })
}

fn parse_count(text: &str) -> Result<usize, String> {
    usize::try_from(parse_int(text)?).map_err(|_| format!("{text:?} must not be negative"))
}

fn parse_i32(text: &str) -> Result<i32, String> {
    i32::try_from(parse_int(text)?).map_err(|_| format!("{text:?} is out of range"))
}

/// A switch's value: a number, 0 for off, anything else for on (as the
/// engine reads its `NCCL_*` switches).
fn parse_switch(text: &str) -> Result<bool, String> {
    Ok(parse_int(text)? != 0)
}

/// Where the buffers live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferMemory {
    /// Memory of the active device, calls ordered on streams.
    Device,
    /// Host memory.
    Host,
}

/// `-M/--memory`: where the buffers live, or nccl-tests' memory report switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryFlag {
    /// `device` or `host`.
    Place(BufferMemory),
    /// nccl-tests' `-M 0|1`.
    Report(i32),
}

fn parse_memory(text: &str) -> Result<MemoryFlag, String> {
    match text.trim() {
        "device" => Ok(MemoryFlag::Place(BufferMemory::Device)),
        "host" => Ok(MemoryFlag::Place(BufferMemory::Host)),
        other => parse_i32(other)
            .map(MemoryFlag::Report)
            .map_err(|_| format!("--memory takes device, host or a number, not {text:?}")),
    }
}

/// A reduction operator as the tests name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TestOp {
    /// `sum`
    Sum,
    /// `prod`
    Prod,
    /// `max`
    Max,
    /// `min`
    Min,
    /// `avg`
    Avg,
    /// `mulsum`: a pre-multiplied sum with a per-rank scalar.
    MulSum,
}

impl TestOp {
    /// Every operator, in nccl-tests' order.
    pub const ALL: [TestOp; 6] = [
        TestOp::Sum,
        TestOp::Prod,
        TestOp::Max,
        TestOp::Min,
        TestOp::Avg,
        TestOp::MulSum,
    ];

    /// nccl-tests' name.
    pub fn name(self) -> &'static str {
        match self {
            TestOp::Sum => "sum",
            TestOp::Prod => "prod",
            TestOp::Max => "max",
            TestOp::Min => "min",
            TestOp::Avg => "avg",
            TestOp::MulSum => "mulsum",
        }
    }

    /// The engine's operator for `rank` (the pre-multiply scalar depends on
    /// the rank).
    pub fn red_op(self, dtype: DataType, rank: usize) -> RedOp {
        match self {
            TestOp::Sum => RedOp::Sum,
            TestOp::Prod => RedOp::Prod,
            TestOp::Max => RedOp::Max,
            TestOp::Min => RedOp::Min,
            TestOp::Avg => RedOp::Avg,
            TestOp::MulSum => {
                let mut scalar = [0u8; 8];
                super::codec::encode(dtype, premul_scalar(rank), &mut scalar);
                RedOp::PreMulSum { scalar }
            }
        }
    }
}

/// The pre-multiply scalar of `rank` for `mulsum` (1 or 2: exact in every
/// type).
pub fn premul_scalar(rank: usize) -> f64 {
    1.0 + (rank % 2) as f64
}

/// `-d`: one datatype, or every one (None).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypeSel(pub Option<DataType>);

/// `-o`: one operator, or every one (None).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpSel(pub Option<TestOp>);

/// Parses `-d`: a type name or `all` (None).
fn parse_datatype(text: &str) -> Result<TypeSel, String> {
    if text == "all" {
        return Ok(TypeSel(None));
    }
    DataType::ALL
        .into_iter()
        .find(|d| d.name() == text)
        .map(|d| TypeSel(Some(d)))
        .ok_or_else(|| {
            let names: Vec<_> = DataType::ALL.iter().map(|d| d.name()).collect();
            format!("invalid type {text:?}: one of {} or all", names.join(" "))
        })
}

fn parse_op(text: &str) -> Result<OpSel, String> {
    if text == "all" {
        return Ok(OpSel(None));
    }
    TestOp::ALL
        .into_iter()
        .find(|o| o.name() == text)
        .map(|o| OpSel(Some(o)))
        .ok_or_else(|| format!("invalid op {text:?}: one of sum prod max min avg mulsum all"))
}

fn parse_root(text: &str) -> Result<i32, String> {
    if text == "all" {
        return Ok(-1);
    }
    parse_i32(text)
}

/// The flags every perf binary takes (nccl-tests' set).
#[derive(Parser, Debug, Clone)]
#[command(
    about = "rccl-rs collective performance and correctness test (nccl-tests compatible)",
    args_override_self = true
)]
pub struct Args {
    /// Number of threads per process.
    #[arg(short = 't', long = "nthreads", default_value = "1", value_parser = parse_count)]
    pub nthreads: usize,
    /// Ranks ("GPUs") per thread, driven together inside a group.
    #[arg(short = 'g', long = "ngpus", default_value = "1", value_parser = parse_count)]
    pub ngpus: usize,
    /// Minimum size in bytes (K/M/G suffixes allowed).
    #[arg(short = 'b', long = "minbytes", default_value = "32M", value_parser = parse_size)]
    pub minbytes: usize,
    /// Maximum size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "32M", value_parser = parse_size)]
    pub maxbytes: usize,
    /// Fixed increment between sizes.
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size)]
    pub stepbytes: usize,
    /// Multiplication factor between sizes (used when > 1).
    #[arg(short = 'f', long = "stepfactor", default_value = "1", value_parser = parse_count)]
    pub stepfactor: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value = "20", value_parser = parse_count)]
    pub iters: usize,
    /// Operations aggregated into one group per iteration.
    #[arg(short = 'm', long = "agg_iters", default_value = "1", value_parser = parse_count)]
    pub agg_iters: usize,
    /// Untimed warm-up iterations.
    #[arg(short = 'w', long = "warmup_iters", default_value = "1", value_parser = parse_count)]
    pub warmup_iters: usize,
    /// Times to run the whole size sweep (0: forever).
    #[arg(short = 'N', long = "run_cycles", default_value = "1", value_parser = parse_count)]
    pub run_cycles: usize,
    /// Initialize communicators from their threads (accepted; rccl-rs always
    /// initializes ranks in parallel).
    #[arg(short = 'p', long = "parallel_init", default_value = "0", value_parser = parse_i32)]
    pub parallel_init: i32,
    /// Check iterations per size (0: no data check).
    #[arg(short = 'c', long = "check", default_value = "1", value_parser = parse_count)]
    pub check: usize,
    /// Reduction: sum, prod, max, min, avg, mulsum or all.
    #[arg(short = 'o', long = "op", default_value = "sum", value_parser = parse_op)]
    pub op: OpSel,
    /// Datatype name or all.
    #[arg(short = 'd', long = "datatype", default_value = "float", value_parser = parse_datatype)]
    pub datatype: TypeSel,
    /// Root rank for rooted collectives (-1 or all: every root).
    #[arg(short = 'r', long = "root", default_value = "0", value_parser = parse_root, allow_hyphen_values = true)]
    pub root: i32,
    /// 1: barrier after each operation; 2: no barrier; 3: barrier after each
    /// outer iteration.
    #[arg(short = 'z', long = "blocking", default_value = "0", value_parser = parse_i32)]
    pub blocking: i32,
    /// Run every rank on the default stream (device memory; host memory
    /// has no streams).
    #[arg(short = 'y', long = "stream_null", default_value = "0", value_parser = parse_i32)]
    pub stream_null: i32,
    /// Timeout in seconds for any operation (0: the engine's default).
    #[arg(short = 'T', long = "timeout", default_value = "0", value_parser = parse_count)]
    pub timeout: usize,
    /// CUDA graph launches (accepted, no effect on host memory).
    #[arg(short = 'G', long = "cudagraph", default_value = "0", value_parser = parse_i32)]
    pub cudagraph: i32,
    /// Report the CPU time of issuing the operations.
    #[arg(short = 'C', long = "report_cputime", default_value = "0", value_parser = parse_i32)]
    pub report_cputime: i32,
    /// Append a timestamp to each result row.
    #[arg(short = 'S', long = "report_timestamps", default_value = "0", value_parser = parse_i32)]
    pub report_timestamps: i32,
    /// JSON output file (nccl-tests' format; the name must end in .json).
    #[arg(short = 'J', long = "output_file")]
    pub output_file: Option<String>,
    /// Time reported: 0 rank 0, 1 average, 2 minimum, 3 maximum over threads.
    #[arg(short = 'a', long = "average", default_value = "1", value_parser = parse_i32)]
    pub average: i32,
    /// Buffer registration: 2 puts both buffers in one symmetric window
    /// (host memory, one rank per thread); other values have no effect.
    #[arg(short = 'R', long = "local_register", default_value = "0", value_parser = parse_i32)]
    pub local_register: i32,
    /// CTA policy (accepted, no effect on host memory).
    #[arg(short = 'x', long = "cta_policy", default_value = "-1", value_parser = parse_i32, allow_hyphen_values = true)]
    pub cta_policy: i32,
    /// Device implementation (accepted, no effect on host memory).
    #[arg(short = 'D', long = "device_implementation", default_value = "0", value_parser = parse_i32)]
    pub device_implementation: i32,
    /// CTAs for a device implementation (accepted, no effect).
    #[arg(short = 'V', long = "device_cta_count", default_value = "16", value_parser = parse_i32)]
    pub device_cta_count: i32,
    /// (rccl-tests) `device` or `host`: where the buffers live (default:
    /// device memory where a device backend is active, `RCCL_DEVICE`,
    /// else host memory). A number is nccl-tests' memory usage report
    /// (accepted, not reported yet).
    #[arg(short = 'M', long = "memory", default_value = "0", value_parser = parse_memory)]
    pub memory: MemoryFlag,
    /// Misalign buffers by this many elements.
    #[arg(short = 'u', long = "unalign", default_value = "0", value_parser = parse_count)]
    pub unalign: usize,
    /// Per-iteration timing: 1 adds i_min, i_max, i_p99 and i_cv% columns
    /// and per-iteration times in the JSON file.
    #[arg(short = 'I', long = "per_iter_timing", default_value = "0", value_parser = parse_i32)]
    pub per_iter_timing: i32,
    /// Leading samples left out of the -I summary statistics.
    #[arg(short = 'K', long = "per_iter_skip", default_value = "0", value_parser = parse_i32)]
    pub per_iter_skip: i32,
    /// (rccl-tests) After each result row, a comment line with the
    /// fastest and slowest rank's time (stragglers).
    #[arg(long = "stragglers")]
    pub stragglers: bool,
    /// (rccl-tests) Start this many processes of this program on this host
    /// as ranks 0..N (torchrun's variables, 127.0.0.1); nccl-tests' -n is
    /// the iteration count, hence the long name.
    #[arg(long = "procs", default_value = "0", value_parser = parse_count)]
    pub procs: usize,
    /// (rccl-tests) Encrypt the TCP connections (bootstrap and the Socket
    /// network) with the pre-shared key in this file (its first line, at
    /// least 32 bytes), as `ncclSetEncryption` does.
    #[arg(long = "psk-file")]
    pub psk_file: Option<std::path::PathBuf>,
    /// (rccl-tests) Deterministic reductions for the measured
    /// communicators: alone or with 1, AllReduce, ReduceScatter and Reduce
    /// give the same bits whatever the algorithm, protocol and channels
    /// (as `NCCL_DETERMINISTIC=1`); 0 turns the mode off whatever the
    /// variable says. Without the flag, `NCCL_DETERMINISTIC` decides.
    #[arg(
        long = "deterministic",
        num_args = 0..=1,
        default_missing_value = "1",
        value_parser = parse_switch
    )]
    pub deterministic: Option<bool>,
}

impl Args {
    /// Flags given that change nothing here, for a note on stderr.
    pub fn ignored(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let flags = [
            (self.cudagraph != 0, "-G/--cudagraph"),
            (
                !matches!(self.local_register, 0 | 2),
                "-R/--local_register (only 2, symmetric windows, is used)",
            ),
            (self.cta_policy != -1, "-x/--cta_policy"),
            (
                self.device_implementation != 0,
                "-D/--device_implementation",
            ),
            (
                matches!(self.memory, MemoryFlag::Report(n) if n != 0),
                "-M/--memory",
            ),
        ];
        for (set, name) in flags {
            if set {
                out.push(name);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_nccl_tests() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("32m"), Ok(32 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("1.5K"), Ok(1536));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn defaults_match_nccl_tests() {
        let a = Args::try_parse_from(["x"]).unwrap();
        assert_eq!(
            (a.minbytes, a.maxbytes, a.stepbytes, a.stepfactor),
            (32 << 20, 32 << 20, 1 << 20, 1)
        );
        assert_eq!(
            (a.iters, a.warmup_iters, a.agg_iters, a.check, a.average),
            (20, 1, 1, 1, 1)
        );
        assert_eq!(a.datatype.0, Some(DataType::Float32));
        assert_eq!(a.op.0, Some(TestOp::Sum));
        let a = Args::try_parse_from([
            "x", "-b", "8", "-e", "128M", "-f", "2", "-g", "8", "-d", "all", "-o", "all", "-r",
            "-1",
        ])
        .unwrap();
        assert_eq!(
            (a.minbytes, a.maxbytes, a.stepfactor, a.ngpus, a.root),
            (8, 128 << 20, 2, 8, -1)
        );
        assert_eq!((a.datatype.0, a.op.0), (None, None));
    }

    #[test]
    fn deterministic_alone_or_with_a_value() {
        let parse = |argv: &[&str]| {
            Args::try_parse_from(argv)
                .ok()
                .map(|a| (a.deterministic, a.minbytes))
        };
        assert_eq!(parse(&["x"]), Some((None, 32 << 20)));
        assert_eq!(
            parse(&["x", "--deterministic"]),
            Some((Some(true), 32 << 20))
        );
        // A flag after it is the next flag, not its value.
        assert_eq!(
            parse(&["x", "--deterministic", "-b", "8"]),
            Some((Some(true), 8))
        );
        assert_eq!(
            parse(&["x", "--deterministic", "1"]),
            Some((Some(true), 32 << 20))
        );
        assert_eq!(
            parse(&["x", "--deterministic", "0", "-b", "8"]),
            Some((Some(false), 8))
        );
        assert_eq!(
            parse(&["x", "--deterministic=0"]),
            Some((Some(false), 32 << 20))
        );
        assert_eq!(parse(&["x", "--deterministic", "yes"]), None);
    }
}
