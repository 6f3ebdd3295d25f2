//! Output: nccl-tests' result table and a JSON document.

use rccl_algorithms::CollKind;
use serde::Serialize;

use crate::SimResult;

/// One row: the call and its simulated result.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// Bytes, as nccl-tests' `size` column.
    pub size: usize,
    /// Elements, as nccl-tests' `count` column.
    pub count: usize,
    /// Datatype name.
    #[serde(rename = "type")]
    pub dtype: String,
    /// Reduction operator name, or `none`.
    pub redop: String,
    /// Root, or -1.
    pub root: i64,
    /// The result.
    #[serde(flatten)]
    pub result: SimResult,
}

/// nccl-tests' `count` column: elements of the larger buffer per rank.
pub fn count_column(kind: CollKind, count: usize, nranks: usize) -> usize {
    match kind {
        CollKind::AllReduce | CollKind::Broadcast | CollKind::Reduce => count,
        _ => count * nranks,
    }
}

/// The table header, as nccl-tests prints it (one result block: the
/// simulation does not distinguish in place from out of place).
pub fn header() -> String {
    let mut s = String::new();
    s.push_str("#                                                          simulated\n");
    s.push_str(&format!(
        "#{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n",
        "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"
    ));
    s.push_str(&format!(
        "#{:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}\n",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    ));
    s
}

/// One table line.
pub fn line(row: &Row) -> String {
    format!(
        " {:>12}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6.2}  {:>6.2}  {:>6}",
        row.size,
        row.count,
        row.dtype,
        row.redop,
        row.root,
        time_str(row.result.time_us),
        row.result.algbw,
        row.result.busbw,
        "N/A"
    )
}

/// nccl-tests' time column: two decimals below 10 ms, fewer above.
fn time_str(t: f64) -> String {
    if t < 1e4 {
        format!("{t:.2}")
    } else if t < 1e5 {
        format!("{t:.1}")
    } else {
        format!("{t:.0}")
    }
}

/// The JSON document: `{"cluster", "collective", "nranks", "rows": [...]}`.
pub fn json(cluster: &str, kind: CollKind, nranks: usize, rows: &[Row]) -> String {
    #[derive(Serialize)]
    struct Doc<'a> {
        simulator: &'static str,
        cluster: &'a str,
        collective: &'static str,
        nranks: usize,
        rows: &'a [Row],
    }
    serde_json::to_string_pretty(&Doc {
        simulator: concat!("rccl-sim ", env!("CARGO_PKG_VERSION")),
        cluster,
        collective: kind.name(),
        nranks,
        rows,
    })
    .expect("rows serialize")
}
