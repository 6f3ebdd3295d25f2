//! Ring vs tree vs hierarchical AllReduce on the H100 preset from 2 to
//! 4096 hosts (256 MiB and 1 MiB), printed as a table and drawn to
//! `docs/img/allreduce_scaling.png`; then the cost of one tensor-parallel
//! group of 8 placed across two hosts.
//!
//! `cargo run --release -p rccl-simulator --example scaling [OUT.png]`

use plotters::prelude::*;
use rccl_algorithms::{builtin, CollKind, CollSpec, Params};
use rccl_simulator::{cluster, default_params, simulate, Protocol};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "docs/img/allreduce_scaling.png".into());
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")?;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        Box::leak(font.into_boxed_slice()),
    )
    .map_err(|_| "font")?;

    let hosts: Vec<usize> = (1..=12).map(|k| 1usize << k).collect();
    let algos = ["ring", "tree", "hier"];
    let sizes = [(256usize << 20, "256 MiB"), (1 << 20, "1 MiB")];
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    println!(
        "| size | algorithm | {} |",
        hosts
            .iter()
            .map(|h| h.to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for (bytes, label) in sizes {
        for algo in algos {
            let mut pts = Vec::new();
            let mut cells = Vec::new();
            for &h in &hosts {
                let c = cluster::h100(h);
                let spec = CollSpec {
                    kind: CollKind::AllReduce,
                    nranks: c.nranks(),
                    root: 0,
                    count: bytes / 4,
                };
                let mut p: Params = default_params(&c, &spec, 4, Protocol::Simple);
                if algo != "ring" {
                    // Full replays at thousands of ranks: 4 channels.
                    p.nchannels = p.nchannels.min(4);
                }
                let start = std::time::Instant::now();
                let r = simulate(&c, &spec, 4, builtin(algo).unwrap(), Protocol::Simple, &p)?;
                eprintln!(
                    "{label} {algo} {h} hosts: {:.1} us busbw {:.2} ({:.2} s)",
                    r.time_us,
                    r.busbw,
                    start.elapsed().as_secs_f64()
                );
                pts.push((h as f64, r.busbw));
                cells.push(format!("{:.1}", r.busbw));
            }
            println!("| {label} | {algo} | {} |", cells.join(" | "));
            series.push((format!("{algo}, {label}"), pts));
        }
    }

    let root = BitMapBackend::new(&out, (1000, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Simulated AllReduce bus bandwidth, H100 hosts of 8 GPUs, 400G rails",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((2f64..4096f64).log_scale(), (0.01f64..1000f64).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("hosts (8 ranks each)")
        .y_desc("busbw (GB/s)")
        .label_style(("sans-serif", 15))
        .draw()?;
    let colors = [RED, BLUE, GREEN];
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = colors[i % 3];
        let style = if i < 3 {
            color.stroke_width(3)
        } else {
            color.mix(0.6).stroke_width(1)
        };
        chart
            .draw_series(LineSeries::new(pts.iter().copied(), style))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()?;
    root.present()?;
    eprintln!("wrote {out}");

    // One tensor-parallel group of 8: one host, or 4 + 4 on two hosts.
    println!("\n| TP group of 8 | size | time (us) | busbw (GB/s) |");
    for bytes in [1usize << 20, 16 << 20, 256 << 20] {
        for (label, hosts, placement) in [
            ("one host", 1, None),
            ("two hosts (4+4)", 2, Some(vec![0, 0, 0, 0, 1, 1, 1, 1])),
        ] {
            let mut c = cluster::h100(hosts);
            c.placement = placement;
            let spec = CollSpec {
                kind: CollKind::AllReduce,
                nranks: 8,
                root: 0,
                count: bytes / 4,
            };
            let p = default_params(&c, &spec, 4, Protocol::Simple);
            let r = simulate(&c, &spec, 4, builtin("ring").unwrap(), Protocol::Simple, &p)?;
            println!(
                "| {label} | {} MiB | {:.1} | {:.1} |",
                bytes >> 20,
                r.time_us,
                r.busbw
            );
        }
    }
    Ok(())
}
