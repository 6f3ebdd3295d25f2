//! Timing and checking one size, out of place or in place (nccl-tests'
//! BenchTime), and printing its half of the row.

use std::time::Instant;

use rccl::RedOp;
use serde_json::{Map, Value};

use super::worker::{Setup, Worker};
use super::Res;
use crate::perf::args::TestOp;
use crate::perf::format::{self, engine_error};
use crate::perf::json::{self, IterStats};

/// The seed of the data used while timing.
const TIMING_SEED: usize = 99;

/// Indices of the smallest and largest of `v` (the first of equals).
fn extremes(v: &[f64]) -> (usize, usize) {
    let mut lo = 0;
    let mut hi = 0;
    for (i, &x) in v.iter().enumerate() {
        if x < v[lo] {
            lo = i;
        }
        if x > v[hi] {
            hi = i;
        }
    }
    (lo, hi)
}

impl Worker<'_> {
    /// Times and checks one size, out-of-place or in-place (nccl-tests'
    /// BenchTime), printing its half of the row.
    pub(super) fn bench(
        &mut self,
        st: &Setup,
        op: Option<TestOp>,
        root: i32,
        in_place: bool,
    ) -> Res<()> {
        let args = self.args;
        if args.check > 0 {
            self.init_data(st, op, root, in_place, TIMING_SEED);
        }
        self.start_coll(st, op, root, in_place, 0)?;
        self.barrier()?;
        let agg = args.agg_iters.max(1);
        let iters = args.iters.max(1);
        let agg_group = self.coll.phases(self.nranks) == 1 && agg > 1 && args.blocking != 1;
        let record = self.setup.per_iter;
        let mut iter_times: Vec<f64> = Vec::with_capacity(if record { args.iters } else { 0 });
        let start = Instant::now();
        let mut coll_only = 0.0;
        // Per-iteration clock readings only where they are used: at the
        // smallest sizes two readings cost a sizeable share of a call.
        let timed = record || args.blocking == 3;
        for iter in 0..args.iters {
            let t0 = timed.then(Instant::now);
            if agg_group {
                rccl::group_start();
            }
            let mut r = Ok(());
            for a in 0..agg {
                r = self.start_coll(st, op, root, in_place, iter * agg + a);
                if r.is_err() {
                    break;
                }
                if args.blocking == 1 {
                    r = self.barrier();
                }
            }
            if agg_group {
                let end = rccl::group_end().map_err(engine_error(self.coll.program_name()));
                r = r.and(end);
            }
            r?;
            if timed {
                self.complete()?;
            }
            if let Some(t0) = t0 {
                let took = t0.elapsed().as_secs_f64();
                if record {
                    iter_times.push(took / agg as f64);
                }
                if args.blocking == 3 {
                    coll_only += took;
                    self.barrier()?;
                }
            }
        }
        self.complete()?;
        let elapsed = if args.blocking == 3 {
            coll_only
        } else {
            start.elapsed().as_secs_f64()
        };
        let local = elapsed / (iters * agg) as f64;
        let delta = match args.average {
            0 => self.allreduce(local, None)?,
            2 => self.allreduce(local, Some(RedOp::Min))?,
            3 => self.allreduce(local, Some(RedOp::Max))?,
            _ => self.allreduce(local, Some(RedOp::Sum))? / self.nranks as f64,
        };
        let (algbw, busbw) =
            self.coll
                .bandwidth(st.counts.param, st.dtype.size(), delta, self.nranks);
        // Every rank's own time (and per-iteration times with -I 1), for
        // the JSON file, the -I columns and --stragglers.
        let spread = if self.setup.gather {
            let mut mine = vec![local];
            mine.extend_from_slice(&iter_times);
            Some(self.gather_f64(&mine)?)
        } else {
            None
        };
        self.barrier()?;

        let report = args.check > 0 && (!in_place || self.coll.checks_in_place());
        let mut wrong = 0u64;
        for _ in 0..args.check {
            self.rep += 1;
            let seed = self.rep;
            self.init_data(st, op, root, in_place, seed);
            self.start_coll(st, op, root, in_place, 0)?;
            self.complete()?;
            if self.corrupt {
                self.corrupt_output(st, root, in_place);
            }
            let local = self.check_data(st, op, root, in_place, seed);
            wrong = self.sum_over_threads(local as f64)? as u64;
            if wrong > 0 {
                break;
            }
        }
        let mut text = format::row_body(delta * 1e6, algbw, busbw, report.then_some(wrong));
        let half = if in_place { "in_place" } else { "out_of_place" };
        if self.main && self.json.is_some() {
            let mut h = Map::new();
            let time_key = if args.report_cputime != 0 {
                "cpu_time"
            } else {
                "time"
            };
            h.insert(time_key.into(), json::num(delta * 1e6));
            h.insert("alg_bw".into(), json::num(algbw));
            h.insert("bus_bw".into(), json::num(busbw));
            h.insert(
                "nwrong".into(),
                if report {
                    json::num(wrong as f64)
                } else {
                    Value::Null
                },
            );
            self.row.insert(half.into(), Value::Object(h));
        }
        if let (true, Some(all)) = (self.main, spread.as_ref()) {
            let n = self.nranks;
            let width = 1 + iter_times.len();
            let rank_times: Vec<f64> = (0..n).map(|r| all[r * width]).collect();
            if record && !iter_times.is_empty() {
                let rpp = self.setup.ranks_per_proc.max(1);
                let process_rows: Vec<Vec<f64>> = (0..n / rpp)
                    .map(|p| {
                        (0..iter_times.len())
                            .map(|i| {
                                (p * rpp..(p + 1) * rpp)
                                    .map(|r| all[r * width + 1 + i])
                                    .fold(0.0, f64::max)
                            })
                            .collect()
                    })
                    .collect();
                let times: Vec<f64> = (0..iter_times.len())
                    .map(|i| process_rows.iter().map(|row| row[i]).fold(0.0, f64::max))
                    .collect();
                let skip = self.setup.skip.min(times.len() - 1);
                let stats = IterStats::of(&times[skip..]);
                text += &format!(
                    "  {:>7}  {:>7}  {:>7}  {:>7}",
                    format::float_str(stats.min * 1e6, 7),
                    format::float_str(stats.max * 1e6, 7),
                    format::float_str(stats.p99 * 1e6, 7),
                    format::float_str(stats.cv_pct(), 7)
                );
                if self.json.is_some() {
                    self.row.insert(
                        format!("{half}_per_iter"),
                        json::per_iter_object(&times, skip, &process_rows),
                    );
                }
            }
            let (fast, slow) = extremes(&rank_times);
            let (tmin, tmax) = (rank_times[fast], rank_times[slow]);
            if self.json.is_some() {
                let extra = self
                    .row
                    .entry("rccl")
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(m) = extra {
                    m.insert(
                        half.into(),
                        serde_json::json!({
                            "rank_time_us": rank_times.iter().map(|t| json::num(t * 1e6)).collect::<Vec<_>>(),
                            "min_rank_time_us": json::num(tmin * 1e6),
                            "max_rank_time_us": json::num(tmax * 1e6),
                            "fastest_rank": fast,
                            "slowest_rank": slow,
                        }),
                    );
                }
            }
            if args.stragglers {
                let pct = if tmin > 0.0 {
                    (tmax - tmin) / tmin * 100.0
                } else {
                    0.0
                };
                self.stragglers.push(format!(
                    "{}: min {:.2} us (rank {fast})  max {:.2} us (rank {slow})  spread {pct:.1}%",
                    if in_place { "in-place" } else { "out-of-place" },
                    tmin * 1e6,
                    tmax * 1e6,
                ));
            }
        }
        if in_place && args.report_timestamps != 0 {
            text += &format!("{:>21}", format::now_string());
        }
        self.print(&text);
        if report && wrong > 0 {
            self.errors += 1;
        }
        self.bw_sum += busbw;
        self.bw_count += 1;
        Ok(())
    }
}
