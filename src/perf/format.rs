//! nccl-tests' printf formats, reproduced.

/// Formats an engine error as nccl-tests reports a failed NCCL call.
pub fn engine_error(what: &str) -> impl Fn(rccl::Error) -> String + '_ {
    move |e| {
        format!(
            "{}: Test NCCL failure {what} '{e}' (ncclResult_t {})",
            hostname(),
            e.code()
        )
    }
}

/// The host's name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its length.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// C's `%.{prec}e`: mantissa, `e`, sign, at least two exponent digits.
pub fn c_exp(value: f64, prec: usize) -> String {
    let s = format!("{value:.prec$e}");
    match s.split_once('e') {
        Some((mant, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mant}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// C's `%g` (precision 6).
pub fn c_g(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if value.is_nan() {
        return if value.is_sign_negative() {
            "-nan"
        } else {
            "nan"
        }
        .into();
    }
    if value.is_infinite() {
        return if value < 0.0 { "-inf" } else { "inf" }.into();
    }
    // The exponent after rounding to 6 significant digits.
    let sci = format!("{value:.5e}");
    let exp: i32 = sci
        .split_once('e')
        .map_or(0, |(_, e)| e.parse().unwrap_or(0));
    let strip = |s: String| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    };
    if (-4..6).contains(&exp) {
        let prec = (5 - exp).max(0) as usize;
        strip(format!("{value:.prec$}"))
    } else {
        let s = c_exp(value, 5);
        let (mant, e) = s.split_once('e').expect("exponent");
        format!("{}e{e}", strip(mant.to_string()))
    }
}

/// nccl-tests' `getFloatStr`: `value` in `width` columns, with fewer
/// decimals as the integer part grows, then exponent form.
pub fn float_str(value: f64, width: usize) -> String {
    let mut power = 0usize;
    let mut val: u64 = 1;
    while value >= val as f64 && power < 40 {
        power += 1;
        val = val.saturating_mul(10);
    }
    if power + 2 < width {
        format!("{value:>width$.2}")
    } else if power + 1 < width {
        format!("{value:>width$.1}")
    } else if power < width + 1 {
        format!("{value:>width$.0}")
    } else if width >= 7 {
        format!("{:>width$}", c_exp(value, 1))
    } else {
        format!("{:>width$}", c_exp(value, 0))
    }
}

/// The headers' label of the time columns (-C), and the label, width and
/// unit line of the timestamp column (-S; empty without it).
fn header_labels(
    report_cputime: bool,
    report_timestamps: bool,
) -> (&'static str, &'static str, usize, &'static str) {
    let time = if report_cputime { "cputime" } else { "time" };
    let (ts_lbl, ts_pad, ts_fmt) = if report_timestamps {
        ("timestamp", 19, "%Y-%m-%d %H:%M:%S")
    } else {
        ("", 0, "")
    };
    (time, ts_lbl, ts_pad, ts_fmt)
}

/// The three column-header lines (after a `#` line).
pub fn result_header(report_cputime: bool, report_timestamps: bool) -> String {
    let (time, ts_lbl, ts_pad, ts_fmt) = header_labels(report_cputime, report_timestamps);
    let mut out = String::from("#\n");
    out += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          \n",
        "", "", "", "", ""
    );
    out += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} {:>ts_pad$}\n",
        "size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong", time, "algbw", "busbw", "#wrong", ts_lbl
    );
    out += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} {:>ts_pad$}\n",
        "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", ts_fmt
    );
    out
}

/// The column headers with -I 1: each half gains i_min, i_max, i_p99
/// and i_cv% columns.
pub fn result_header_per_iter(report_cputime: bool, report_timestamps: bool) -> String {
    let (time, ts_lbl, ts_pad, ts_fmt) = header_labels(report_cputime, report_timestamps);
    let mut out = String::from("#\n");
    out += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}              out-of-place (+ per-iteration)                                in-place (+ per-iteration)\n",
        "", "", "", "", ""
    );
    let half = |t: &str, a: &str, b: &str, w: &str, i: [&str; 4]| {
        format!(
            "  {t:>7}  {a:>6}  {b:>6}  {w:>6}  {:>7}  {:>7}  {:>7}  {:>7}",
            i[0], i[1], i[2], i[3]
        )
    };
    out += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{}{} {:>ts_pad$}\n",
        "size",
        "count",
        "type",
        "redop",
        "root",
        half(
            time,
            "algbw",
            "busbw",
            "#wrong",
            ["i_min", "i_max", "i_p99", "i_cv%"]
        ),
        half(
            time,
            "algbw",
            "busbw",
            "#wrong",
            ["i_min", "i_max", "i_p99", "i_cv%"]
        ),
        ts_lbl
    );
    out += &format!(
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}{}{} {:>ts_pad$}\n",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        half(
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            ["(us)", "(us)", "(us)", "(%)"]
        ),
        half(
            "(us)",
            "(GB/s)",
            "(GB/s)",
            "",
            ["(us)", "(us)", "(us)", "(%)"]
        ),
        ts_fmt
    );
    out
}

/// The start of a result row: size, count, type, op and root.
pub fn row_preamble(
    bytes: usize,
    count: usize,
    type_name: &str,
    op_name: &str,
    root: i32,
) -> String {
    format!("{bytes:>12}  {count:>12}  {type_name:>8}  {op_name:>6}  {root:>6}")
}

/// One half (out-of-place or in-place) of a result row; `wrong` is None
/// when the data was not checked.
pub fn row_body(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> String {
    let t = float_str(time_us, 7);
    let a = float_str(algbw, 6);
    let b = float_str(busbw, 6);
    match wrong {
        Some(w) => format!("  {t:>7}  {a:>6}  {b:>6}  {:>6}", c_g(w as f64)),
        None => format!("  {t:>7}  {a:>6}  {b:>6}    N/A"),
    }
}

/// Local time as `%Y-%m-%d %H:%M:%S`.
pub fn now_string() -> String {
    let mut buf = [0u8; 64];
    // SAFETY: time(NULL) only reads the clock.
    let now = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: an all-zero tm is a valid value to be overwritten.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is
    // thread-safe.
    if unsafe { libc::localtime_r(&now, &mut tm) }.is_null() {
        return String::new();
    }
    let fmt = c"%Y-%m-%d %H:%M:%S";
    // SAFETY: buf is writable for its length, fmt is NUL-terminated and tm
    // was filled above.
    let n = unsafe { libc::strftime(buf.as_mut_ptr().cast(), buf.len(), fmt.as_ptr(), &tm) };
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_str_matches_printf() {
        assert_eq!(float_str(5.125, 7), "   5.12");
        assert_eq!(float_str(12345.6, 7), "12345.6");
        assert_eq!(float_str(123456.4, 7), " 123456");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(123456789.0, 7), "1.2e+08");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(1234.5, 6), "1234.5");
    }

    #[test]
    fn g_matches_printf() {
        assert_eq!(c_g(0.0), "0");
        assert_eq!(c_g(12.0), "12");
        assert_eq!(c_g(1048576.0), "1.04858e+06");
        assert_eq!(c_g(1.234567891), "1.23457");
        assert_eq!(c_g(0.000123), "0.000123");
        assert_eq!(c_g(1.5e-5), "1.5e-05");
    }

    #[test]
    fn header_widths() {
        let h = result_header(false, false);
        let lines: Vec<_> = h.lines().collect();
        assert_eq!(lines[2], "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong ");
        assert_eq!(
            row_preamble(8, 2, "float", "sum", -1),
            "           8             2     float     sum      -1"
        );
    }
}
