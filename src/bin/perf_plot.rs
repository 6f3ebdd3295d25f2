//! `perf_plot`: draws bus bandwidth against message size from perf JSON
//! files (`-J`), one line per file, into a PNG.
//!
//! ```text
//! perf_plot -o busbw.png shm.json=shm sockets.json=sockets
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

use std::process::ExitCode;

use clap::Parser;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use serde_json::Value;

/// Draws busbw against size (log2 scale) from perf JSON files, one line each.
#[derive(Parser, Debug)]
#[command(about)]
struct Cli {
    /// Output PNG.
    #[arg(short = 'o', long = "output", default_value = "busbw.png")]
    output: String,
    /// Plot the in-place half of each row (default: out-of-place).
    #[arg(long = "in-place")]
    in_place: bool,
    /// Chart title (default: the first file's test name).
    #[arg(long)]
    title: Option<String>,
    /// Picture size in pixels, WIDTHxHEIGHT.
    #[arg(long, default_value = "960x600")]
    size: String,
    /// JSON files written with -J, each optionally `FILE=LABEL` (the
    /// label defaults to the file's name).
    #[arg(required = true)]
    files: Vec<String>,
}

/// One line of the chart.
struct Series {
    label: String,
    points: Vec<(f64, f64)>,
}

/// The rows of a file's results for the first row's type, op and root,
/// as (size, busbw) pairs.
fn load(path: &str, in_place: bool) -> Result<(Vec<(f64, f64)>, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let doc: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))?;
    let results = doc["results"]
        .as_array()
        .ok_or_else(|| format!("{path}: no results list"))?;
    let first = results
        .first()
        .ok_or_else(|| format!("{path}: no results"))?;
    let key = |r: &Value| (r["type"].clone(), r["redop"].clone(), r["root"].clone());
    let want = key(first);
    let half = if in_place { "in_place" } else { "out_of_place" };
    let mut points = Vec::new();
    for r in results.iter().filter(|r| key(r) == want) {
        let (Some(size), Some(bw)) = (r["size"].as_f64(), r[half]["bus_bw"].as_f64()) else {
            continue;
        };
        if size > 0.0 {
            points.push((size, bw));
        }
    }
    if points.is_empty() {
        return Err(format!("{path}: no {half} rows with a size above 0"));
    }
    // The test's name: the program in args[0].
    let name = doc["args"][0]
        .as_str()
        .and_then(|a| a.rsplit('/').next())
        .unwrap_or("perf")
        .to_string();
    let what = format!(
        "{name} ({} {})",
        want.0.as_str().unwrap_or(""),
        want.1.as_str().unwrap_or("")
    );
    Ok((points, what))
}

/// A byte count as the axis shows it: 8B, 64KB, 1MB, 2GB.
fn size_label(bytes: f64) -> String {
    let b = bytes.round() as u64;
    for (unit, shift) in [("GB", 30), ("MB", 20), ("KB", 10)] {
        if b >= 1 << shift && b.is_multiple_of(1 << shift) {
            return format!("{}{unit}", b >> shift);
        }
    }
    if b >= 1 << 10 {
        return format!("{:.1}KB", bytes / 1024.0);
    }
    format!("{b}B")
}

/// Finds a TrueType font and registers it for plotters' text; false when
/// none is found (the chart is then drawn without text).
fn load_font() -> bool {
    let mut candidates: Vec<String> = std::env::var("RCCL_PLOT_FONT").into_iter().collect();
    candidates.extend(
        [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
            "/usr/local/share/fonts/DejaVuSans.ttf",
            "/Library/Fonts/Arial.ttf",
        ]
        .map(String::from),
    );
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            // plotters keeps the font for the program's life.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
];

fn draw(cli: &Cli, series: &[Series], title: &str, font: bool) -> Result<(), String> {
    let (w, h) = cli
        .size
        .split_once('x')
        .and_then(|(w, h)| Some((w.parse::<u32>().ok()?, h.parse::<u32>().ok()?)))
        .filter(|&(w, h)| w >= 200 && h >= 150)
        .ok_or_else(|| {
            format!(
                "--size {:?}: expected WIDTHxHEIGHT, at least 200x150",
                cli.size
            )
        })?;
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", cli.output);
    let root = BitMapBackend::new(&cli.output, (w, h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let all = series.iter().flat_map(|s| s.points.iter());
    let (xmin, xmax, ymax) = all.fold((f64::MAX, 0f64, 0f64), |(a, b, c), &(x, y)| {
        (a.min(x), b.max(x), c.max(y))
    });
    // The x axis is log2(size), labelled with sizes, so that the ticks
    // fall on powers of two as the sweeps (-f 2, -f 4) do.
    let (lo, hi) = (xmin.log2() - 0.3, xmax.log2().max(xmin.log2() + 1.0) + 0.3);
    let ymax = if ymax > 0.0 { ymax * 1.1 } else { 1.0 };
    let mut builder = ChartBuilder::on(&root);
    builder.margin(16);
    if font {
        builder
            .caption(title, ("sans-serif", 22))
            .x_label_area_size(44)
            .y_label_area_size(64);
    } else {
        builder.x_label_area_size(8).y_label_area_size(8);
    }
    let mut chart = builder
        .build_cartesian_2d(lo..hi, 0f64..ymax)
        .map_err(|e| err(&e))?;
    if font {
        chart
            .configure_mesh()
            .x_desc("message size (bytes)")
            .y_desc("bus bandwidth (GB/s)")
            .x_labels(((hi - lo) as usize + 1).min(16))
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-6 {
                    size_label(x.round().exp2())
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| format!("{y:.2}"))
            .label_style(("sans-serif", 14))
            .axis_desc_style(("sans-serif", 16))
            .draw()
            .map_err(|e| err(&e))?;
    } else {
        chart
            .configure_mesh()
            .x_labels(0)
            .y_labels(0)
            .draw()
            .map_err(|e| err(&e))?;
    }
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let line = chart
            .draw_series(LineSeries::new(
                s.points.iter().map(|&(x, y)| (x.log2(), y)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?;
        if font {
            line.label(s.label.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        }
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|&(x, y)| Circle::new((x.log2(), y), 3, color.filled())),
            )
            .map_err(|e| err(&e))?;
    }
    if font {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 15))
            .draw()
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut series = Vec::new();
    let mut first_what = None;
    for spec in &cli.files {
        let (path, label) = match spec.split_once('=') {
            Some((p, l)) if !l.is_empty() && !std::path::Path::new(spec).exists() => {
                (p, l.to_string())
            }
            _ => (
                spec.as_str(),
                spec.rsplit('/').next().unwrap_or(spec).to_string(),
            ),
        };
        match load(path, cli.in_place) {
            Ok((points, what)) => {
                first_what.get_or_insert(what);
                series.push(Series { label, points });
            }
            Err(e) => {
                eprintln!("perf_plot: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let half = if cli.in_place {
        "in-place"
    } else {
        "out-of-place"
    };
    let title = cli.title.clone().unwrap_or_else(|| {
        format!(
            "{}, {half} busbw",
            first_what.unwrap_or_else(|| "perf".into())
        )
    });
    let font = load_font();
    if !font {
        eprintln!(
            "perf_plot: no TrueType font found (install fonts-dejavu-core or set RCCL_PLOT_FONT); drawing without text"
        );
    }
    match draw(&cli, &series, &title, font) {
        Ok(()) => {
            println!("wrote {}", cli.output);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("perf_plot: {e}");
            ExitCode::from(2)
        }
    }
}
