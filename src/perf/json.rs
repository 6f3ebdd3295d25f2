//! `-J file.json`: nccl-tests' JSON output, file version 3, built with
//! serde_json. The keys and their order follow nccl-tests' writer (which
//! writes booleans as the strings "true" / "false", the root as a
//! `%6i`-formatted string and NaN as the string "nan"); what rccl-rs adds
//! lives under keys named `rccl`, which nccl-tests' readers ignore.

use std::fs::{File, OpenOptions};
use std::io::Write;

use serde_json::{Map, Value};

/// nccl-tests' `JSON_FILE_VERSION`.
pub const FILE_VERSION: i64 = 3;

/// nccl-tests' `jsonBool`: a boolean written as a string.
pub fn bool_str(b: bool) -> Value {
    Value::String(if b { "true" } else { "false" }.into())
}

/// nccl-tests' `jsonDouble`: a number, or the string "nan" (and, since
/// JSON has no infinities, "inf" / "-inf").
pub fn num(v: f64) -> Value {
    match serde_json::Number::from_f64(v) {
        Some(n) => Value::Number(n),
        None if v.is_nan() => Value::String("nan".into()),
        None => Value::String(if v > 0.0 { "inf" } else { "-inf" }.into()),
    }
}

/// Summary statistics of per-iteration times, as nccl-tests'
/// `computeIterStats` defines them (population standard deviation,
/// percentiles by rank in the sorted times).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IterStats {
    /// Shortest.
    pub min: f64,
    /// Longest.
    pub max: f64,
    /// Mean.
    pub avg: f64,
    /// Median (`sorted[n / 2]`).
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Population standard deviation.
    pub stdev: f64,
}

impl IterStats {
    /// Statistics of `times` (at least one).
    pub fn of(times: &[f64]) -> IterStats {
        let n = times.len();
        assert!(n > 0, "no times");
        let mut sorted = times.to_vec();
        sorted.sort_by(f64::total_cmp);
        let pct = |p: usize| sorted[(n * p).div_ceil(100).saturating_sub(1).min(n - 1)];
        let avg = sorted.iter().sum::<f64>() / n as f64;
        let var = sorted.iter().map(|t| (t - avg) * (t - avg)).sum::<f64>() / n as f64;
        IterStats {
            min: sorted[0],
            max: sorted[n - 1],
            avg,
            p50: sorted[n / 2],
            p95: pct(95),
            p99: pct(99),
            stdev: var.sqrt(),
        }
    }

    /// Coefficient of variation in percent (0 when the mean is 0).
    pub fn cv_pct(&self) -> f64 {
        if self.avg > 0.0 {
            self.stdev / self.avg * 100.0
        } else {
            0.0
        }
    }
}

/// The `*_per_iter` object of one half of a result row. `times` and
/// `process_rows` are in seconds; `process_rows` is written only when there
/// is more than one process, as nccl-tests does.
pub fn per_iter_object(times: &[f64], skip: usize, process_rows: &[Vec<f64>]) -> Value {
    let st = IterStats::of(&times[skip.min(times.len() - 1)..]);
    let us = |v: f64| num(v * 1e6);
    let mut m = Map::new();
    m.insert("skipped_iterations".into(), Value::from(skip as i64));
    m.insert("min_us".into(), us(st.min));
    m.insert("max_us".into(), us(st.max));
    m.insert("avg_us".into(), us(st.avg));
    m.insert("p50_us".into(), us(st.p50));
    m.insert("p95_us".into(), us(st.p95));
    m.insert("p99_us".into(), us(st.p99));
    m.insert("stdev_us".into(), us(st.stdev));
    m.insert("cv_pct".into(), num(st.cv_pct()));
    m.insert(
        "times_us".into(),
        Value::Array(times.iter().map(|&t| us(t)).collect()),
    );
    if process_rows.len() > 1 {
        m.insert(
            "per_process_max_times_us".into(),
            Value::Array(
                process_rows
                    .iter()
                    .map(|row| Value::Array(row.iter().map(|&t| us(t)).collect()))
                    .collect(),
            ),
        );
    }
    Value::Object(m)
}

/// Whether an environment variable's value is withheld from the file.
fn secret_name(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    [
        "SECRET",
        "TOKEN",
        "PASSWORD",
        "PASSWD",
        "CREDENTIAL",
        "PRIVATE",
        "_KEY",
    ]
    .iter()
    .any(|w| upper.contains(w))
}

/// The environment as nccl-tests lists it (`NAME=value`), with the values
/// of variables that look like secrets replaced.
pub fn environment() -> Vec<Value> {
    std::env::vars_os()
        .map(|(k, v)| {
            let k = k.to_string_lossy();
            if secret_name(&k) {
                Value::String(format!("{k}=<withheld>"))
            } else {
                Value::String(format!("{k}={}", v.to_string_lossy()))
            }
        })
        .collect()
}

/// An open JSON document, written out whole by [`JsonDoc::finish`].
pub struct JsonDoc {
    file: File,
    /// The file actually opened (nccl-tests appends `.0`, `.1`, ... when the
    /// name is taken).
    pub path: String,
    head: Map<String, Value>,
    config: Option<Value>,
    /// Result rows, in order.
    pub results: Vec<Value>,
    errors: Vec<String>,
    footer: Option<(u64, f64, Option<f64>)>,
}

impl JsonDoc {
    /// Opens `path` as nccl-tests does: only names ending in `.json` (any
    /// case) are written; an existing file is never overwritten, the name
    /// gets `.0`, `.1`, ... appended instead. `Err` carries the line to
    /// print when the file cannot be created.
    pub fn create(path: &str, argv: &[String]) -> Result<JsonDoc, String> {
        let is_json = std::path::Path::new(path)
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("json"));
        if !is_json {
            return Err(format!(
                "# skipping json output; {path} does not end in .json"
            ));
        }
        let mut attempt = path.to_string();
        let mut n = 0;
        let file = loop {
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&attempt)
            {
                Ok(f) => break f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 10_000 => {
                    attempt = format!("{path}.{n}");
                    n += 1;
                }
                Err(_) => return Err(format!("# skipping json output; {attempt} not accessible")),
            }
        };
        let mut head = Map::new();
        head.insert("version".into(), Value::from(FILE_VERSION));
        head.insert(
            "start_time".into(),
            Value::String(super::format::now_string()),
        );
        head.insert(
            "args".into(),
            Value::Array(argv.iter().map(|a| Value::String(a.clone())).collect()),
        );
        head.insert("env".into(), Value::Array(environment()));
        // rccl-rs is not NCCL: no NCCL version code to report.
        head.insert("nccl_version".into(), Value::from(0));
        Ok(JsonDoc {
            file,
            path: attempt,
            head,
            config: None,
            results: Vec::new(),
            errors: Vec::new(),
            footer: None,
        })
    }

    /// Sets the `config` object.
    pub fn set_config(&mut self, config: Value) {
        self.config = Some(config);
    }

    /// Records the footer: wrong-element count, average bus bandwidth and
    /// the `NCCL_TESTS_MIN_BW` it was checked against.
    pub fn set_footer(&mut self, errors: u64, avg_bw: f64, min_bw: Option<f64>) {
        self.footer = Some((errors, avg_bw, min_bw));
    }

    /// Records an error message for the `errors` list.
    pub fn error(&mut self, msg: String) {
        self.errors.push(msg);
    }

    /// Writes the whole document: the head, `config`, `results`, then (when
    /// the run reached its footer) `out_of_bounds` and
    /// `average_bus_bandwidth`, `errors` and `end_time`.
    pub fn finish(mut self) -> std::io::Result<()> {
        let mut doc = std::mem::take(&mut self.head);
        if let Some(c) = self.config.take() {
            doc.insert("config".into(), c);
        }
        doc.insert(
            "results".into(),
            Value::Array(std::mem::take(&mut self.results)),
        );
        if let Some((errors, bw, min_bw)) = self.footer {
            let mut oob = Map::new();
            oob.insert("count".into(), Value::from(errors));
            oob.insert("okay".into(), bool_str(errors == 0));
            doc.insert("out_of_bounds".into(), Value::Object(oob));
            let mut abw = Map::new();
            abw.insert("bandwidth".into(), num(bw));
            abw.insert(
                "okay".into(),
                match min_bw {
                    None => Value::String("unchecked".into()),
                    Some(m) => bool_str(bw >= m * 0.9),
                },
            );
            doc.insert("average_bus_bandwidth".into(), Value::Object(abw));
        }
        doc.insert(
            "errors".into(),
            Value::Array(self.errors.drain(..).map(Value::String).collect()),
        );
        doc.insert(
            "end_time".into(),
            Value::String(super::format::now_string()),
        );
        let text = serde_json::to_string(&Value::Object(doc)).map_err(std::io::Error::other)?;
        self.file.write_all(text.as_bytes())?;
        self.file.write_all(b"\n")?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_follow_nccl_tests_definitions() {
        let t: Vec<f64> = (1..=10).map(|v| v as f64).collect();
        let s = IterStats::of(&t);
        assert_eq!(
            (s.min, s.max, s.p50, s.p95, s.p99),
            (1.0, 10.0, 6.0, 10.0, 10.0)
        );
        assert!((s.avg - 5.5).abs() < 1e-12);
        assert!((s.stdev - 8.25f64.sqrt()).abs() < 1e-12);
        let one = IterStats::of(&[3.0]);
        assert_eq!((one.p50, one.p99, one.stdev), (3.0, 3.0, 0.0));
        let hundred: Vec<f64> = (1..=100).map(|v| v as f64).collect();
        let s = IterStats::of(&hundred);
        assert_eq!((s.p95, s.p99), (95.0, 99.0));
    }

    #[test]
    fn values_like_the_c_writer() {
        assert_eq!(num(f64::NAN), Value::String("nan".into()));
        assert_eq!(num(1.5), serde_json::json!(1.5));
        assert_eq!(bool_str(true), Value::String("true".into()));
        assert!(secret_name("NCCL_COMM_SECRET"));
        assert!(!secret_name("NCCL_SOCKET_IFNAME"));
    }
}
