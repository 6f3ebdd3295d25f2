//! One thread's driver: the ranks it owns, the sweep over types, ops,
//! roots and sizes (nccl-tests' TimeTest), and the closing summary.

use std::io::Write;
use std::sync::Mutex;

use rccl::{Communicator, DataType};
use serde_json::{Map, Value};

use super::rank::{Buffer, Rank};
use super::{Res, RunSetup, CORRUPT_ENV};
use crate::perf::args::{Args, TestOp};
use crate::perf::coll::{Coll, Counts};
use crate::perf::format::{self, hostname};
use crate::perf::json::JsonDoc;

/// Sizes of one step of the sweep.
#[derive(Clone, Copy)]
pub(super) struct Setup {
    pub(super) dtype: DataType,
    pub(super) counts: Counts,
    /// nccl-tests' `maxbytes / max(send, recv bytes)`: buffer positions to
    /// rotate through.
    pub(super) steps: usize,
}

impl Setup {
    pub(super) fn total_bytes(&self) -> usize {
        self.counts.send.max(self.counts.recv) * self.dtype.size()
    }
}

pub(super) struct Outcome {
    pub(super) ok: bool,
}

/// One thread: drives its ranks (inside a group when more than one).
pub(super) struct Worker<'a> {
    pub(super) coll: Coll,
    pub(super) args: &'a Args,
    pub(super) ranks: Vec<Rank>,
    pub(super) main: bool,
    pub(super) nranks: usize,
    pub(super) errors: u64,
    pub(super) bw_sum: f64,
    pub(super) bw_count: usize,
    pub(super) rep: usize,
    pub(super) corrupt: bool,
    pub(super) device_base: usize,
    /// The JSON document (main thread of the main process only).
    pub(super) json: Option<&'a Mutex<JsonDoc>>,
    pub(super) setup: RunSetup,
    /// The JSON result row being filled.
    pub(super) row: Map<String, Value>,
    /// The straggler summaries of the row being filled (--stragglers).
    pub(super) stragglers: Vec<String>,
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for r in &self.ranks {
                r.comm.abort();
                r.books.abort();
            }
        }
    }
}

/// Locks the JSON document (a panicked holder leaves it usable).
pub(super) fn lock(doc: &Mutex<JsonDoc>) -> std::sync::MutexGuard<'_, JsonDoc> {
    doc.lock().unwrap_or_else(|e| e.into_inner())
}

impl<'a> Worker<'a> {
    pub(super) fn new(
        coll: Coll,
        args: &'a Args,
        comms: Vec<(Communicator, Communicator)>,
        main: bool,
        device_base: usize,
        json: Option<&'a Mutex<JsonDoc>>,
        setup: RunSetup,
    ) -> Res<Worker<'a>> {
        let nranks = comms.first().map_or(1, |(c, _)| c.count());
        let bytes = args.maxbytes + args.unalign * 8;
        let device = setup.device;
        let ranks = comms
            .into_iter()
            .map(|(comm, books)| {
                let stream = match device {
                    None => None,
                    // -y: every rank on the default stream.
                    Some(device) if args.stream_null != 0 => Some(device.stream(0)),
                    Some(device) => Some(device.create_stream()),
                }
                .transpose()
                .map_err(|e| format!("{}: cannot create a stream: {e}", hostname()))?;
                Ok(Rank {
                    comm,
                    books,
                    stream,
                    send: Buffer::new(bytes, device)?,
                    recv: Buffer::new(bytes, device)?,
                    window: None,
                })
            })
            .collect::<Res<Vec<Rank>>>()?;
        if args.local_register == 2 {
            // Registration is collective: one rank per thread.
            if ranks.len() != 1 || device.is_some() {
                return Err(
                    "-R 2 registers host buffers as symmetric windows: it needs one rank \
                            per thread (-g 1) and host memory"
                        .into(),
                );
            }
        }
        Ok(Worker {
            coll,
            args,
            ranks,
            main,
            nranks,
            errors: 0,
            bw_sum: 0.0,
            bw_count: 0,
            rep: 0,
            corrupt: std::env::var(CORRUPT_ENV).is_ok_and(|v| v == "1"),
            device_base,
            json,
            setup,
            row: Map::new(),
            stragglers: Vec::new(),
        })
    }

    pub(super) fn print(&self, text: &str) {
        if self.main {
            print!("{text}");
            if text.ends_with('\n') {
                let _ = std::io::stdout().flush();
            }
        }
    }

    pub(super) fn run_all(mut self) -> Res<Outcome> {
        let r = if self.args.local_register == 2 {
            let bytes = self.args.maxbytes + self.args.unalign * 8;
            super::rank::register_symmetric(&mut self.ranks[0], bytes)
                .and_then(|()| self.run_tests())
        } else {
            self.run_tests()
        };
        if r.is_err() {
            for rank in &self.ranks {
                rank.comm.abort();
                rank.books.abort();
            }
        }
        r
    }

    fn run_tests(&mut self) -> Res<Outcome> {
        self.device_report()?;
        let header = if self.setup.per_iter {
            format::result_header_per_iter(
                self.args.report_cputime != 0,
                self.args.report_timestamps != 0,
            )
        } else {
            format::result_header(
                self.args.report_cputime != 0,
                self.args.report_timestamps != 0,
            )
        };
        self.print(&header);
        let types: Vec<DataType> = self
            .args
            .datatype
            .0
            .map_or(DataType::ALL.to_vec(), |d| vec![d]);
        let ops: Vec<Option<TestOp>> = if self.coll.uses_op() {
            self.args
                .op
                .0
                .map_or(TestOp::ALL.iter().map(|&o| Some(o)).collect(), |o| {
                    vec![Some(o)]
                })
        } else {
            vec![None]
        };
        let roots: Vec<i32> = if !self.coll.has_root() {
            vec![-1]
        } else if self.args.root < 0 {
            (0..self.nranks as i32).collect()
        } else {
            if self.args.root as usize >= self.nranks {
                return Err(format!(
                    "invalid root {} for {} ranks",
                    self.args.root, self.nranks
                ));
            }
            vec![self.args.root]
        };
        match self.coll.supports(self.nranks) {
            Ok(()) => {
                for &dtype in &types {
                    for &op in &ops {
                        for &root in &roots {
                            self.time_test(dtype, op, root)?;
                        }
                    }
                }
            }
            Err(msg) => self.print(&format!("{msg}\n")),
        }
        self.footer()
    }

    fn setup(&self, size: usize, dtype: DataType) -> Setup {
        let elt = dtype.size();
        let counts = self.coll.counts(size / elt, elt, self.nranks);
        let total = counts.send.max(counts.recv) * elt;
        let steps = self.args.maxbytes.checked_div(total).unwrap_or(1).max(1);
        Setup {
            dtype,
            counts,
            steps,
        }
    }

    /// The size sweep for one type, op and root (nccl-tests' TimeTest).
    fn time_test(&mut self, dtype: DataType, op: Option<TestOp>, root: i32) -> Res<()> {
        let args = self.args;
        self.barrier()?;
        // Warm-up for every size, doubling.
        let mut size = args.minbytes;
        while size <= args.maxbytes {
            let st = self.setup(size, dtype);
            for iter in 0..args.warmup_iters {
                self.start_coll(&st, op, root, false, iter)?;
            }
            self.complete()?;
            if size == 0 {
                break;
            }
            size *= 2;
        }
        let op_name = match op {
            Some(o) => o.name(),
            None => self.coll.fixed_op_name(),
        };
        let mut cycles = args.run_cycles;
        loop {
            let mut size = args.minbytes;
            while size <= args.maxbytes {
                let st = self.setup(size, dtype);
                self.print(&format::row_preamble(
                    st.total_bytes(),
                    st.counts.param,
                    dtype.name(),
                    op_name,
                    root,
                ));
                self.row = Map::new();
                self.stragglers.clear();
                if self.main && self.json.is_some() {
                    self.row.insert("size".into(), st.total_bytes().into());
                    self.row.insert("count".into(), st.counts.param.into());
                    self.row.insert("type".into(), dtype.name().into());
                    self.row.insert("redop".into(), op_name.into());
                    self.row.insert("root".into(), format!("{root:>6}").into());
                }
                self.bench(&st, op, root, false)?;
                self.bench(&st, op, root, true)?;
                self.print("\n");
                if !self.stragglers.is_empty() {
                    self.print(&format!(
                        "#  stragglers  {}\n",
                        self.stragglers.join("  |  ")
                    ));
                }
                if let (true, Some(doc)) = (self.main, self.json) {
                    let mut row = std::mem::take(&mut self.row);
                    row.insert("actual_iterations".into(), args.iters.into());
                    row.insert("experiment_name".into(), "".into());
                    let tuning = self.tuning_json(&st, root);
                    let extra = row
                        .entry("rccl")
                        .or_insert_with(|| Value::Object(Map::new()));
                    if let (Value::Object(m), Value::Object(t)) = (extra, tuning) {
                        // The tuner's choice first, then the per-rank times.
                        let times = std::mem::take(m);
                        m.extend(t);
                        m.extend(times);
                    }
                    lock(doc).results.push(Value::Object(row));
                }
                let next = if args.stepfactor > 1 {
                    size * args.stepfactor
                } else {
                    size + args.stepbytes
                };
                if next == size {
                    break;
                }
                size = next;
            }
            if cycles == 1 {
                break;
            }
            cycles = cycles
                .saturating_sub(1)
                .max(if cycles == 0 { 0 } else { 1 });
        }
        Ok(())
    }

    fn footer(&mut self) -> Res<Outcome> {
        // Errors are counted per thread, then summed over threads and
        // processes, as nccl-tests does.
        let errors = self.sum_over_threads(self.errors as f64)? as u64;
        let bw = if self.bw_count > 0 {
            self.bw_sum / self.bw_count as f64
        } else {
            0.0
        };
        let min_bw: Option<f64> = std::env::var("NCCL_TESTS_MIN_BW")
            .ok()
            .and_then(|v| v.trim().parse().ok());
        let bw_fail = min_bw.is_some_and(|m| bw < m * 0.9);
        if let (true, Some(doc)) = (self.main, self.json) {
            lock(doc).set_footer(errors, bw, min_bw);
        }
        let mut text = format!(
            "# {:<20} : {} {}\n",
            "Out of bounds values",
            errors,
            if errors > 0 { "FAILED" } else { "OK" }
        );
        let verdict = match min_bw {
            None => "",
            Some(_) if bw_fail => "FAILED",
            Some(_) => "OK",
        };
        text += &format!(
            "# {:<20} : {} {}\n",
            "Avg bus bandwidth",
            format::c_g(bw),
            verdict
        );
        text += "#\n";
        text += &format!(
            "# Collective test concluded: {}\n",
            self.coll.program_name()
        );
        text += "#\n\n";
        self.print(&text);
        // The communicators are destroyed when the worker drops them
        // (Communicator::finalize is a blocking barrier per communicator, so
        // one thread cannot finalize several of them).
        Ok(Outcome {
            ok: errors == 0 && !bw_fail,
        })
    }
}
