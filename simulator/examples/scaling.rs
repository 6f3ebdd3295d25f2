//! AllReduce on the H100 preset (8 ranks and 8 NICs per host) from 2 to
//! 256 hosts, 256 MiB and 1 MiB: the rail-aligned ring, the tree (a chain
//! in each host, a double binary tree across hosts, per channel), the
//! hierarchical algorithm, the tuner's pick among those three (the
//! fastest replay, `rccl_simulator::tune::fastest`, as the engine's tuner
//! picks across hosts), and for comparison a flat ring that crosses every
//! host on one NIC (the ring before rails: the same schedules on hosts of
//! one NIC). Printed as a table and drawn to
//! `docs/img/allreduce_scaling.png`; then the cost of one tensor-parallel
//! group of 8 placed across two hosts.
//!
//! `cargo run --release -p rccl-simulator --example scaling [OUT.png]`

use plotters::prelude::*;
use rccl_algorithms::{builtin, CollKind, CollSpec, Params, Topology};
use rccl_simulator::tune::{fastest, params_for, Candidate};
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

    let hosts: Vec<usize> = (1..=8).map(|k| 1usize << k).collect();
    let algos = ["ring", "tree", "hier"];
    let rows = ["ring", "tree", "hier", "tuner's pick", "flat ring (1 NIC)"];
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
        // busbw per row, per host count; the pick's name per host count.
        let mut table: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
        let mut picks = Vec::new();
        for &h in &hosts {
            let c = cluster::h100(h);
            let spec = CollSpec {
                kind: CollKind::AllReduce,
                nranks: c.nranks(),
                root: 0,
                count: bytes / 4,
            };
            let p: Params = default_params(&c, &spec, 4, Protocol::Simple);
            let topo = Topology::from_hosts(c.host_of());
            let candidates: Vec<Candidate<'_>> = algos
                .iter()
                .map(|a| Candidate {
                    algorithm: builtin(a).unwrap(),
                    protocol: Protocol::Simple,
                    params: params_for(builtin(a).unwrap(), &topo, &spec, 4, p),
                })
                .collect();
            let start = std::time::Instant::now();
            let ranking = fastest(&c, &spec, 4, &candidates);
            let busbw =
                |t: f64| bytes as f64 / t / 1e3 * 2.0 * (c.nranks() - 1) as f64 / c.nranks() as f64;
            for (i, t) in ranking.times_us.iter().enumerate() {
                table[i].push(busbw(t.ok_or("a replay failed")?));
            }
            let best = ranking.best.ok_or("no replay")?;
            let picked = table[best][table[best].len() - 1];
            table[3].push(picked);
            picks.push(algos[best]);
            let mut one_nic = c.clone();
            one_nic.nic.per_host = Some(1);
            let flat = simulate(
                &one_nic,
                &spec,
                4,
                builtin("ring").unwrap(),
                Protocol::Simple,
                &p,
            )?;
            table[4].push(flat.busbw);
            eprintln!(
                "{label} {h} hosts: {:?} pick {} flat {:.1} ({:.1} s)",
                ranking.times_us,
                algos[best],
                flat.busbw,
                start.elapsed().as_secs_f64()
            );
        }
        for (row, values) in rows.iter().zip(&table) {
            let cells: Vec<String> = values
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    if *row == "tuner's pick" {
                        format!("{v:.1} ({})", picks[i])
                    } else {
                        format!("{v:.1}")
                    }
                })
                .collect();
            println!("| {label} | {row} | {} |", cells.join(" | "));
            let pts = hosts
                .iter()
                .zip(values)
                .map(|(&h, &v)| (h as f64, v))
                .collect();
            series.push((format!("{row}, {label}"), pts));
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
        .build_cartesian_2d((2f64..256f64).log_scale(), (0.1f64..1000f64).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("hosts (8 ranks each)")
        .y_desc("busbw (GB/s)")
        .label_style(("sans-serif", 15))
        .draw()?;
    let colors = [RED, BLUE, GREEN, BLACK, MAGENTA];
    for (i, (name, pts)) in series.iter().enumerate() {
        let color = colors[i % rows.len()];
        let style = if i < rows.len() {
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
