//! The bench's bar chart: each link alone, their sum, the ceiling, braid per mode, MPTCP.

use std::path::Path;

use braid_sim::plot::{Format, PixelText};
use plotters::prelude::*;

use crate::bench::BenchResult;

/// Draw `r` as a bar chart into `path` (`.svg` or `.png`).
pub fn draw(r: &BenchResult, title: &str, path: &Path) -> Result<(), String> {
    let format = Format::from_path(path)
        .ok_or_else(|| format!("{}: the plot must end in .svg or .png", path.display()))?;
    let mut bars: Vec<(String, f64, RGBColor)> = Vec::new();
    for (i, l) in r.links.iter().enumerate() {
        bars.push((format!("link {i}"), l.tcp_bps, RGBColor(150, 150, 150)));
    }
    bars.push(("sum".into(), r.sum_bps, RGBColor(80, 80, 80)));
    bars.push(("ceiling".into(), r.ceiling_bps, RGBColor(40, 40, 40)));
    for (m, b) in &r.braid {
        bars.push((format!("braid {m}"), b.tcp_bps, RGBColor(31, 119, 180)));
    }
    if let Some(m) = r.mptcp_bps {
        bars.push(("MPTCP".into(), m, RGBColor(214, 39, 40)));
    }
    let size = (1024, 600);
    match format {
        Format::Svg => render(
            &bars,
            title,
            SVGBackend::new(path, size).into_drawing_area(),
        ),
        Format::Png => render(
            &bars,
            title,
            PixelText(BitMapBackend::new(path, size)).into_drawing_area(),
        ),
    }
}

fn render<DB: DrawingBackend>(
    bars: &[(String, f64, RGBColor)],
    title: &str,
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let ymax = bars.iter().map(|b| b.1 / 1e6).fold(1.0, f64::max) * 1.15;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(16)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax * 1.08)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc("TCP goodput (Mbit/s)")
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v, c))| {
            Rectangle::new(
                [(i as f64 + 0.15, 0.0), (i as f64 + 0.85, v / 1e6)],
                c.filled(),
            )
        }))
        .map_err(e)?;
    // Each bar carries its name and its value above it.
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (name, v, _))| {
            Text::new(
                name.clone(),
                (i as f64 + 0.12, v / 1e6 + ymax * 0.07),
                ("sans-serif", 13),
            )
        }))
        .map_err(e)?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v, _))| {
            Text::new(
                format!("{:.1}", v / 1e6),
                (i as f64 + 0.2, v / 1e6 + ymax * 0.03),
                ("sans-serif", 13),
            )
        }))
        .map_err(e)?;
    root.present().map_err(e)?;
    Ok(())
}
