//! Schedules from a file: a researcher's algorithm, loaded at run time and
//! proved by the verifier before it is used.
//!
//! The format (JSON, described in `docs/SCHEDULES.md`) gives, for one
//! collective and one rank count, every rank's steps per channel, with
//! slices in units of `count / parts` elements:
//!
//! ```json
//! { "name": "ring4", "collective": "AllReduce", "nranks": 4, "parts": 4,
//!   "ranks": [ { "channels": [ [ [ {"op": "send", "to": 1, "src": ["send", 3, 1]} ], ... ] ] }, ... ] }
//! ```
//!
//! **Scaling with count.** A file fits every call whose count is a
//! multiple of `parts`: unit `i` of a buffer is elements `i * q .. (i + 1) *
//! q` with `q = count / parts` (so for AllGather's receive buffer, units
//! `b * parts ..` are rank `b`'s block). The file describes one pipeline
//! loop: the call runs the file's steps once per loop, each loop moving
//! the next at most `chunk_elems` elements of every unit, so messages stay
//! within a pipeline chunk whatever the count; an operation over several
//! units becomes one primitive per unit. Loading proves the file at
//! several counts and chunk sizes (one and several loops, a short last
//! loop), out of place (required) and in place (recorded: the loaded
//! algorithm refuses the in-place form when that fails). Other counts,
//! collectives, rank counts and roots are refused
//! ([`LoadedAlgorithm::fits`]).
//!
//! The file's channels are used as they are: `params.nchannels` must be at
//! least [`LoadedAlgorithm::nchannels`] (the schedule is padded with empty
//! channels up to it).

use std::path::Path;

use serde::Deserialize;

use crate::pieces::chunks;
use crate::{
    verify_schedules, Algorithm, CollKind, CollSpec, Params, Prim, Rank, Schedule, Slice, Step,
    Topology, VerifyError,
};

/// Why a schedule file was refused.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The system's message.
        message: String,
    },
    /// Not valid JSON of the format.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What is wrong, with line and column.
        message: String,
    },
    /// Valid JSON that describes no usable schedule.
    #[error("{path}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// The schedules are wrong: the verifier's error, which names the first
    /// bad step by rank, channel, step and primitive.
    #[error("{path}: schedule refused for {context}: {error}")]
    Verify {
        /// The file.
        path: String,
        /// The shape it failed for.
        context: String,
        /// The verifier's error.
        error: Box<VerifyError>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    name: String,
    collective: String,
    nranks: usize,
    #[serde(default)]
    root: usize,
    parts: usize,
    ranks: Vec<FileRank>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileRank {
    channels: Vec<Vec<Vec<FileOp>>>,
}

#[derive(Clone, Copy, Deserialize, PartialEq, Eq, Debug)]
#[serde(rename_all = "lowercase")]
enum FileBuf {
    Send,
    Recv,
}

/// `[buffer, offset, len]` in units of `count / parts`.
type FileSlice = (FileBuf, usize, usize);

#[derive(Clone, Copy, Deserialize, Debug)]
#[serde(tag = "op", deny_unknown_fields)]
enum FileOp {
    #[serde(rename = "send")]
    Send { to: Rank, src: FileSlice },
    #[serde(rename = "recv")]
    Recv { from: Rank, dst: FileSlice },
    #[serde(rename = "copy")]
    Copy { src: FileSlice, dst: FileSlice },
    #[serde(rename = "copySend")]
    CopySend {
        src: FileSlice,
        dst: FileSlice,
        to: Rank,
    },
    #[serde(rename = "recvReduceSend")]
    RecvReduceSend {
        from: Rank,
        src: FileSlice,
        to: Rank,
    },
    #[serde(rename = "recvReduceCopy")]
    RecvReduceCopy {
        from: Rank,
        src: FileSlice,
        dst: FileSlice,
    },
    #[serde(rename = "recvReduceCopySend")]
    RecvReduceCopySend {
        from: Rank,
        src: FileSlice,
        dst: FileSlice,
        to: Rank,
    },
    #[serde(rename = "recvCopySend")]
    RecvCopySend {
        from: Rank,
        dst: FileSlice,
        to: Rank,
    },
    #[serde(rename = "recvReduceCopyPartial")]
    RecvReduceCopyPartial {
        from: Rank,
        src: FileSlice,
        dst: FileSlice,
    },
    #[serde(rename = "reduceCopy")]
    ReduceCopy { src: FileSlice, dst: FileSlice },
    #[serde(rename = "reduceCopyPartial")]
    ReduceCopyPartial { src: FileSlice, dst: FileSlice },
}

impl FileOp {
    /// Units each slice of the operation covers (all slices agree, as
    /// checked at load).
    fn units(&self) -> usize {
        self.slices().first().map_or(0, |s| s.2)
    }

    fn slices(&self) -> Vec<FileSlice> {
        match *self {
            FileOp::Send { src, .. } | FileOp::RecvReduceSend { src, .. } => vec![src],
            FileOp::Recv { dst, .. } | FileOp::RecvCopySend { dst, .. } => vec![dst],
            FileOp::Copy { src, dst }
            | FileOp::CopySend { src, dst, .. }
            | FileOp::RecvReduceCopy { src, dst, .. }
            | FileOp::RecvReduceCopySend { src, dst, .. }
            | FileOp::RecvReduceCopyPartial { src, dst, .. }
            | FileOp::ReduceCopy { src, dst }
            | FileOp::ReduceCopyPartial { src, dst } => vec![src, dst],
        }
    }

    /// The primitive with every slice mapped by `s`.
    fn map(self, s: impl Fn(FileSlice) -> Slice) -> Prim {
        match self {
            FileOp::Send { to, src } => Prim::Send { to, src: s(src) },
            FileOp::Recv { from, dst } => Prim::Recv { from, dst: s(dst) },
            FileOp::Copy { src, dst } => Prim::Copy {
                src: s(src),
                dst: s(dst),
            },
            FileOp::CopySend { src, dst, to } => Prim::CopySend {
                src: s(src),
                dst: s(dst),
                to,
            },
            FileOp::RecvReduceSend { from, src, to } => Prim::RecvReduceSend {
                from,
                src: s(src),
                to,
            },
            FileOp::RecvReduceCopy { from, src, dst } => Prim::RecvReduceCopy {
                from,
                src: s(src),
                dst: s(dst),
            },
            FileOp::RecvReduceCopySend { from, src, dst, to } => Prim::RecvReduceCopySend {
                from,
                src: s(src),
                dst: s(dst),
                to,
            },
            FileOp::RecvCopySend { from, dst, to } => Prim::RecvCopySend {
                from,
                dst: s(dst),
                to,
            },
            FileOp::RecvReduceCopyPartial { from, src, dst } => Prim::RecvReduceCopyPartial {
                from,
                src: s(src),
                dst: s(dst),
            },
            FileOp::ReduceCopy { src, dst } => Prim::ReduceCopy {
                src: s(src),
                dst: s(dst),
            },
            FileOp::ReduceCopyPartial { src, dst } => Prim::ReduceCopyPartial {
                src: s(src),
                dst: s(dst),
            },
        }
    }

    /// The primitives of one pipeline loop: unit `i` of a buffer is
    /// elements `i * q .. (i + 1) * q`, of which the loop moves
    /// `base .. base + len`; an operation over several units becomes one
    /// primitive per unit, in order.
    fn pieces(self, q: usize, base: usize, len: usize) -> impl Iterator<Item = Prim> {
        (0..self.units()).map(move |k| {
            self.map(|(buf, offset, _)| Slice {
                buf: match buf {
                    FileBuf::Send => crate::Buf::Send,
                    FileBuf::Recv => crate::Buf::Recv,
                },
                offset: (offset + k) * q + base,
                len,
            })
        })
    }
}

/// A schedule file, loaded and proved: an [`Algorithm`] for the collective
/// and rank count it was written for, at counts that are a multiple of its
/// `parts`.
#[derive(Debug)]
pub struct LoadedAlgorithm {
    name: &'static str,
    kind: CollKind,
    nranks: usize,
    root: usize,
    parts: usize,
    in_place: bool,
    /// `ranks[r][c]` is rank r's step list on channel c, in units.
    ranks: Vec<Vec<Vec<Vec<FileOp>>>>,
}

impl LoadedAlgorithm {
    /// The collective the file implements.
    pub fn kind(&self) -> CollKind {
        self.kind
    }

    /// The rank count the file is written for.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The count unit: calls must have a multiple of it.
    pub fn parts(&self) -> usize {
        self.parts
    }

    /// Channels the file uses.
    pub fn nchannels(&self) -> usize {
        self.ranks.iter().map(Vec::len).max().unwrap_or(0)
    }

    /// Whether the file's schedules run the call `spec`.
    pub fn fits(&self, spec: &CollSpec) -> bool {
        spec.kind == self.kind
            && spec.nranks == self.nranks
            && spec.count.checked_rem(self.parts) == Some(0)
            && (!spec.kind.has_root() || spec.root == self.root)
    }

    /// The schedule of `rank` for `count` elements, pipelined in loops of
    /// at most `chunk` elements per unit, over at least `min_channels`
    /// channels.
    fn scaled(&self, rank: Rank, count: usize, chunk: usize, min_channels: usize) -> Schedule {
        let mut schedule = Schedule::new(self.nchannels().max(min_channels));
        let q = count / self.parts;
        for (c, steps) in self.ranks[rank].iter().enumerate() {
            let out = &mut schedule.channels[c];
            for (base, len) in chunks(0, q, chunk) {
                for step in steps {
                    let prims: Vec<Prim> =
                        step.iter().flat_map(|op| op.pieces(q, base, len)).collect();
                    if !prims.is_empty() {
                        out.push(Step { prims });
                    }
                }
            }
        }
        schedule
    }
}

impl Algorithm for LoadedAlgorithm {
    fn name(&self) -> &'static str {
        self.name
    }

    fn supports(&self, kind: CollKind) -> bool {
        kind == self.kind
    }

    fn supports_in_place(&self, kind: CollKind) -> bool {
        kind == self.kind && self.in_place
    }

    fn schedule(&self, spec: &CollSpec, rank: Rank, params: &Params, _topo: &Topology) -> Schedule {
        assert!(
            self.fits(spec),
            "schedule file {} does not fit {spec:?} (it is for {} over {} ranks, counts a \
             multiple of {})",
            self.name,
            self.kind.name(),
            self.nranks,
            self.parts
        );
        self.scaled(
            rank,
            spec.count,
            params.chunk_elems.max(1),
            params.nchannels,
        )
    }
}

fn kind_named(name: &str) -> Option<CollKind> {
    CollKind::ALL
        .into_iter()
        .find(|k| k.name().eq_ignore_ascii_case(name))
}

/// Load a schedule file and prove it (see the [module](self)
/// documentation); a wrong one is refused with the verifier's error.
pub fn load_schedule_file(path: impl AsRef<Path>) -> Result<LoadedAlgorithm, FileError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| FileError::Io {
        path: shown.clone(),
        message: e.to_string(),
    })?;
    parse_schedule(&shown, &text)
}

/// [`load_schedule_file`] for text already read; `origin` names it in
/// errors.
pub fn parse_schedule(origin: &str, text: &str) -> Result<LoadedAlgorithm, FileError> {
    let invalid = |message: String| FileError::Invalid {
        path: origin.to_string(),
        message,
    };
    let file: FileFormat = serde_json::from_str(text).map_err(|e| FileError::Parse {
        path: origin.to_string(),
        message: e.to_string(),
    })?;
    let kind = kind_named(&file.collective)
        .ok_or_else(|| invalid(format!("unknown collective {:?}", file.collective)))?;
    if file.nranks == 0 || file.parts == 0 {
        return Err(invalid("nranks and parts must be at least 1".into()));
    }
    if file.ranks.len() != file.nranks {
        return Err(invalid(format!(
            "{} ranks described for nranks {}",
            file.ranks.len(),
            file.nranks
        )));
    }
    if kind.has_root() && file.root >= file.nranks {
        return Err(invalid(format!("root {} out of range", file.root)));
    }
    let alg = LoadedAlgorithm {
        // Leaked once per loaded file, so that the name lives as long as
        // the algorithm registry's names.
        name: Box::leak(file.name.into_boxed_str()),
        kind,
        nranks: file.nranks,
        root: file.root,
        parts: file.parts,
        in_place: false,
        ranks: file.ranks.into_iter().map(|r| r.channels).collect(),
    };
    for (r, rank) in alg.ranks.iter().enumerate() {
        for (c, steps) in rank.iter().enumerate() {
            for (st, step) in steps.iter().enumerate() {
                for (p, op) in step.iter().enumerate() {
                    let slices = op.slices();
                    if slices.iter().any(|s| s.2 == 0 || s.2 != slices[0].2) {
                        return Err(invalid(format!(
                            "rank {r} channel {c} step {st} prim {p}: slices must cover the \
                             same number of units, at least one"
                        )));
                    }
                }
            }
        }
    }
    let mut in_place = true;
    for (units, chunk) in [(1, 1), (2, 1), (3, 2), (5, 2)] {
        let count = alg.parts * units;
        let spec = CollSpec {
            kind,
            nranks: alg.nranks,
            root: alg.root,
            count,
        };
        let schedules: Vec<Schedule> = (0..alg.nranks)
            .map(|r| alg.scaled(r, count, chunk, 0))
            .collect();
        verify_schedules(&spec, &schedules, false, chunk).map_err(|error| FileError::Verify {
            path: origin.to_string(),
            context: format!("count {count}, chunk {chunk}, out of place"),
            error: Box::new(error),
        })?;
        in_place &= verify_schedules(&spec, &schedules, true, chunk).is_ok();
    }
    Ok(LoadedAlgorithm { in_place, ..alg })
}
