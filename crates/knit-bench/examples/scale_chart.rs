//! The chart of `bench/scale.sh`: Ready nodes, registered nodes and machines
//! over time from the scale request, and the control plane's CPU.
//!
//!     scale_chart SAMPLES.csv OUT.png N
//!
//! Text needs a TrueType font (`knit_bench::find_font`); without one the
//! chart is drawn without text and says so on stderr.

use knit_bench::{find_font, read_samples, Sample};
use plotters::prelude::*;
use std::path::Path;
use std::process::ExitCode;

const READY: RGBColor = RGBColor(0x1f, 0x77, 0xb4);
const NODES: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const MACHINES: RGBColor = RGBColor(0x99, 0x99, 0x99);
const CPU: RGBColor = RGBColor(0xd6, 0x27, 0x28);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let [_, csv, png, n] = args.as_slice() else {
        eprintln!("usage: scale_chart SAMPLES.csv OUT.png N");
        return ExitCode::from(2);
    };
    let Ok(n) = n.parse::<u32>() else {
        eprintln!("N: value {n:?} is not a count");
        return ExitCode::from(2);
    };
    let samples = match read_samples(Path::new(csv)) {
        Ok(s) if !s.is_empty() => s,
        Ok(_) => {
            eprintln!("{csv}: no samples");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let text = match find_font() {
        Some(path) => match std::fs::read(&path) {
            // plotters keeps registered fonts for the process's life.
            Ok(bytes) => plotters::style::register_font(
                "sans-serif",
                FontStyle::Normal,
                Box::leak(bytes.into_boxed_slice()),
            )
            .is_ok(),
            Err(e) => {
                eprintln!("{}: {e}; the chart has no text", path.display());
                false
            }
        },
        None => {
            eprintln!("no TrueType font found (KNIT_CHART_FONT, fonts-liberation, fonts-dejavu): the chart has no text");
            false
        }
    };
    match draw(&samples, Path::new(png), n, text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{png}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn draw(s: &[Sample], png: &Path, n: u32, text: bool) -> Result<(), Box<dyn std::error::Error>> {
    let t_min = s.iter().map(|x| x.t_s).fold(f64::INFINITY, f64::min);
    let t_max = s.iter().map(|x| x.t_s).fold(f64::NEG_INFINITY, f64::max);
    let y_max = s
        .iter()
        .map(|x| x.instances.max(x.nodes.unwrap_or(0)))
        .max()
        .unwrap_or(0)
        .max(n)
        .max(1);
    let cpu_max = s
        .iter()
        .filter_map(|x| x.server_cpu_pct)
        .fold(10.0_f64, f64::max)
        .ceil();
    let root = BitMapBackend::new(png, (900, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(12);
    if text {
        builder
            .caption(
                format!("knit scale 0 -> {n} -> 0 on one host: nodes over time"),
                ("sans-serif", 20),
            )
            .x_label_area_size(36)
            .y_label_area_size(48)
            .right_y_label_area_size(56);
    }
    let mut chart = builder
        .build_cartesian_2d(t_min..t_max, 0u32..(y_max + y_max / 20 + 1))?
        .set_secondary_coord(t_min..t_max, 0.0..cpu_max);
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("seconds from the scale-out request")
            .y_desc("nodes / machines");
    } else {
        mesh.disable_x_mesh().disable_y_mesh();
    }
    mesh.draw()?;
    if text {
        chart
            .configure_secondary_axes()
            .y_desc("control plane CPU, % of a core")
            .draw()?;
    }
    let series = [
        (
            "machines",
            MACHINES,
            s.iter().map(|x| (x.t_s, x.instances)).collect::<Vec<_>>(),
        ),
        (
            "registered nodes",
            NODES,
            s.iter().filter_map(|x| Some((x.t_s, x.nodes?))).collect(),
        ),
        (
            "Ready nodes",
            READY,
            s.iter().filter_map(|x| Some((x.t_s, x.ready?))).collect(),
        ),
    ];
    for (label, color, points) in series {
        let drawn = chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?;
        if text {
            drawn.label(label).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        }
    }
    let cpu: Vec<(f64, f64)> = s
        .iter()
        .filter_map(|x| Some((x.t_s, x.server_cpu_pct?)))
        .collect();
    let drawn = chart.draw_secondary_series(LineSeries::new(cpu, CPU.stroke_width(1)))?;
    if text {
        drawn
            .label("control plane CPU (right axis)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], CPU.stroke_width(1)));
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 14))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
