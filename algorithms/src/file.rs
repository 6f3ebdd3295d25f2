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
//! multiple of `parts`: a slice `[buf, offset, len]` covers elements
//! `offset * u .. (offset + len) * u` with `u = count / parts`. Scaling every
//! slice by the same factor maps each element of the unit schedule to `u`
//! elements that behave alike, so the file is proved for `u = 1` and
//! `u = 2`, with FIFOs of one element (the least buffering the engine may
//! have), out of place (required) and in place (recorded: the loaded
//! algorithm refuses the in-place form when that fails). Counts that are
//! not a multiple of `parts`, other collectives and other rank counts are
//! refused ([`LoadedAlgorithm::fits`]).
//!
//! The file's channels are used as they are: `params.nchannels` must be at
//! least [`LoadedAlgorithm::nchannels`] (the schedule is padded with empty
//! channels up to it); `params.chunk_elems` is not used, as the file fixes
//! its messages.

use std::path::Path;

use serde::Deserialize;

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
        error: VerifyError,
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
    /// The primitive, with slices scaled by `u` elements per unit.
    fn prim(self, u: usize) -> Prim {
        let s = |(buf, offset, len): FileSlice| Slice {
            buf: match buf {
                FileBuf::Send => crate::Buf::Send,
                FileBuf::Recv => crate::Buf::Recv,
            },
            offset: offset * u,
            len: len * u,
        };
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
            && spec.count % self.parts == 0
            && (!spec.kind.has_root() || spec.root == self.root)
    }

    /// Every rank's schedule at `u` elements per unit.
    fn schedules(&self, u: usize) -> Vec<Schedule> {
        (0..self.nranks).map(|r| self.scaled(r, u, 0)).collect()
    }

    fn scaled(&self, rank: Rank, u: usize, min_channels: usize) -> Schedule {
        let mut schedule = Schedule::new(self.nchannels().max(min_channels));
        if u == 0 {
            return schedule;
        }
        for (c, steps) in self.ranks[rank].iter().enumerate() {
            schedule.channels[c] = steps
                .iter()
                .map(|step| Step {
                    prims: step.iter().map(|op| op.prim(u)).collect(),
                })
                .collect();
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
        self.scaled(rank, spec.count / self.parts, params.nchannels)
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
    let mut in_place = true;
    for u in [1, 2] {
        let spec = CollSpec {
            kind,
            nranks: alg.nranks,
            root: alg.root,
            count: alg.parts * u,
        };
        let schedules = alg.schedules(u);
        verify_schedules(&spec, &schedules, false, 1).map_err(|error| FileError::Verify {
            path: origin.to_string(),
            context: format!("count {} out of place", spec.count),
            error,
        })?;
        in_place &= verify_schedules(&spec, &schedules, true, 1).is_ok();
    }
    Ok(LoadedAlgorithm { in_place, ..alg })
}
