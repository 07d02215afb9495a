//! The overlay plot: the CDF of the throughput gain over the default path, striping
//! over the best two and the best three paths (the paper's Fig. 9), SVG or PNG.

use std::path::Path;

use plotters::prelude::*;

use super::Report;
use crate::plot::{Format, PixelText, PlotError};

fn err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// Draw the gain CDFs of `rep` to `path`. Fails if the report has no gain experiment.
pub fn draw(rep: &Report, path: &Path, format: Format) -> Result<(), PlotError> {
    let Some(g) = &rep.gain else {
        return Err(PlotError::Draw(
            "the scenario has no [gain] experiment: nothing to plot".into(),
        ));
    };
    let lines = [
        ("best 2 paths", &g.summary_two.cdf),
        ("best 3 paths", &g.summary_three.cdf),
    ];
    let title = format!(
        "{}: gain over the default path ({} flows per curve)",
        rep.scenario, g.summary_two.flows
    );
    let size = (1024, 640);
    match format {
        Format::Svg => render(
            &title,
            &lines,
            SVGBackend::new(path, size).into_drawing_area(),
        ),
        Format::Png => render(
            &title,
            &lines,
            PixelText(BitMapBackend::new(path, size)).into_drawing_area(),
        ),
    }
}

type Line<'a> = (&'a str, &'a Vec<(f64, f64)>);

fn render<DB: DrawingBackend>(
    title: &str,
    lines: &[Line<'_>],
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(err)?;
    let xs = lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
    let (mut x0, mut x1) = xs.fold((0.0f64, 0.0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    x0 = (x0 / 50.0).floor() * 50.0;
    x1 = ((x1 / 50.0).ceil() * 50.0).max(x0 + 50.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, 0.0..1.0)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("throughput gain over the average default path (%)")
        .y_desc("fraction of flows (CDF)")
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    let colors = [RGBColor(31, 119, 180), RGBColor(214, 39, 40)];
    for (i, (name, pts)) in lines.iter().enumerate() {
        let color = colors[i % colors.len()];
        // A step function: each flow raises the curve at its gain.
        let mut steps = Vec::with_capacity(pts.len() * 2 + 1);
        let mut last = 0.0;
        if let Some(&(x, _)) = pts.first() {
            steps.push((x0.min(x), 0.0));
        }
        for &(x, y) in pts.iter() {
            steps.push((x, last));
            steps.push((x, y));
            last = y;
        }
        steps.push((x1, last));
        chart
            .draw_series(LineSeries::new(steps, Color::stroke_width(&color, 2)))
            .map_err(err)?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}
