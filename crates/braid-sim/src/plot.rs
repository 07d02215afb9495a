//! Plots of a scenario's results: the swept parameter on the x axis, one line per run
//! variant, the chosen metric on the y axis; SVG or PNG.
//!
//! PNG text is drawn with the public-domain 8×8 bitmap font of the `font8x8` crate, so
//! no system font library or font file is needed and the output is the same on every
//! machine. SVG text is left to the viewer's fonts.

use std::path::Path;

use plotters::prelude::*;
use plotters_backend::{
    text_anchor::{HPos, VPos},
    BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind,
};

use crate::report::Report;
use crate::scenario::Scenario;

/// Output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Scalable vector graphics.
    Svg,
    /// Portable network graphics.
    Png,
}

impl Format {
    /// From the file extension (`.svg` or `.png`, any case).
    pub fn from_path(p: &Path) -> Option<Format> {
        let ext = p.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "svg" => Some(Format::Svg),
            "png" => Some(Format::Png),
            _ => None,
        }
    }
}

/// Check a plot's output path before anything runs (a lab run takes minutes): the name
/// ends in .svg or .png, and its folder exists. A missing folder is an error naming it,
/// not created: a mistyped path would otherwise scatter folders, and the plot is one
/// file like any other output (`>` and `braid recv` do not create folders either).
/// `flag` names the option in the error.
pub fn check_path(flag: &str, p: &Path) -> Result<Format, String> {
    let shown = p.display();
    let format = Format::from_path(p)
        .ok_or_else(|| format!("{flag} {shown}: the file name must end in .svg or .png"))?;
    if p.is_dir() {
        return Err(format!(
            "{flag} {shown}: is a folder; give a file name ending in .svg or .png"
        ));
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let d = dir.display();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(format),
        Ok(_) => Err(format!("{flag} {shown}: '{d}' is not a folder")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "{flag} {shown}: the folder '{d}' does not exist; create it first (mkdir -p {d}) or choose another path"
        )),
        Err(e) => Err(format!("{flag} {shown}: folder '{d}': {e}")),
    }
}

/// Why a plot could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The scenario sweeps nothing.
    #[error("the scenario has no [[sweep]]: nothing to put on the x axis")]
    NoSweep,
    /// The drawing backend failed (e.g. the file could not be written).
    #[error("drawing failed: {0}")]
    Draw(String),
}

/// One line of the plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points, sorted by x.
    pub points: Vec<(f64, f64)>,
}

fn is_rate(metric: &str) -> bool {
    metric.ends_with("_bps")
}

/// Y axis label for a metric.
pub fn metric_label(metric: &str) -> String {
    match metric {
        "goodput_bps" => "goodput (Mbit/s)".into(),
        "inorder_goodput_bps" => "in-order goodput (Mbit/s)".into(),
        "out_of_order" => "out-of-order deliveries (packets)".into(),
        "max_reorder_depth" => "max reorder depth (packets)".into(),
        "packets_lost" => "packets lost".into(),
        "latency_mean_ms" => "mean latency (ms)".into(),
        "latency_p50_ms" => "median latency (ms)".into(),
        "latency_p99_ms" => "99th percentile latency (ms)".into(),
        "latency_max_ms" => "max latency (ms)".into(),
        "marker_overhead" => "control overhead (fraction of bytes)".into(),
        "resync_max_s" => "longest resynchronization (s)".into(),
        "tcp_goodput_bps" => "TCP goodput (Mbit/s)".into(),
        "tcp_retransmits" => "TCP retransmissions".into(),
        m => m.into(),
    }
}

/// The lines to draw: per run label (and per value of any other swept parameter), the
/// metric against the x parameter. Rates are converted to Mbit/s.
pub fn series(sc: &Scenario, rep: &Report) -> Result<Vec<Series>, PlotError> {
    let x = sc.plot.x.as_deref().ok_or(PlotError::NoSweep)?;
    let metric = sc.plot.y.as_str();
    let scale = if is_rate(metric) { 1e-6 } else { 1.0 };
    let mut out: Vec<Series> = Vec::new();
    for r in &rep.runs {
        let Some(&xv) = r.params.get(x) else {
            continue;
        };
        let others: Vec<String> = r
            .params
            .iter()
            .filter(|(k, _)| k.as_str() != x)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let name = if others.is_empty() {
            r.label.clone()
        } else {
            format!("{} ({})", r.label, others.join(", "))
        };
        let y = r.metric(metric).unwrap_or(0.0) * scale;
        match out.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((xv, y)),
            None => out.push(Series {
                name,
                points: vec![(xv, y)],
            }),
        }
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(out)
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// Draw the scenario's plot into `path`.
pub fn draw(sc: &Scenario, rep: &Report, path: &Path, format: Format) -> Result<(), PlotError> {
    let lines = series(sc, rep)?;
    let size = (1024, 640);
    match format {
        Format::Svg => {
            let root = SVGBackend::new(path, size).into_drawing_area();
            render(sc, &lines, root)
        }
        Format::Png => {
            let root = PixelText(BitMapBackend::new(path, size)).into_drawing_area();
            render(sc, &lines, root)
        }
    }
}

fn err<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// The axes' ranges: every point's x, y from 0 (or below, for a negative value) to 8 %
/// above the largest; never empty.
fn bounds(lines: &[Series]) -> (f64, f64, f64, f64) {
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    let mut y0 = 0.0f64;
    for s in lines {
        for &(x, y) in &s.points {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if !x0.is_finite() {
        x0 = 0.0;
        x1 = 1.0;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    (x0, x1, y0, y1 * 1.08)
}

/// Draw the whole figure: the chart on the left, the legend in its own panel on the
/// right (so it never hides a line), then write it out.
fn render<DB: DrawingBackend>(
    sc: &Scenario,
    lines: &[Series],
    root: DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), PlotError> {
    root.fill(&WHITE).map_err(err)?;
    let legend_font: TextStyle = ("sans-serif", 14).into_font().into();
    let panel_w = legend_panel_width(lines, &root, &legend_font)?;
    let (total_w, _) = root.dim_in_pixel();
    let (plot_area, legend_area) = root.split_horizontally(total_w - panel_w);
    draw_chart(sc, lines, &plot_area)?;
    draw_legend(lines, &legend_area, &legend_font)?;
    root.present().map_err(err)?;
    Ok(())
}

/// The legend panel's width in pixels: the widest series name plus room for its colour
/// sample, at most two fifths of the figure.
fn legend_panel_width<DB: DrawingBackend>(
    lines: &[Series],
    root: &DrawingArea<DB, plotters::coord::Shift>,
    legend_font: &TextStyle,
) -> Result<u32, PlotError> {
    let mut text_w = 0u32;
    for s in lines {
        let (w, _) = root.estimate_text_size(&s.name, legend_font).map_err(err)?;
        text_w = text_w.max(w);
    }
    let (total_w, _) = root.dim_in_pixel();
    Ok((text_w + 48).min(total_w * 2 / 5))
}

/// The chart's title and axis descriptions: the scenario's `[plot]` settings, else the
/// scenario's name, the swept parameter and the metric's label.
fn chart_texts(sc: &Scenario) -> (String, String, String) {
    let title = sc.plot.title.clone().unwrap_or_else(|| sc.name.clone());
    let xl = sc
        .plot
        .x_label
        .clone()
        .or_else(|| sc.plot.x.clone())
        .unwrap_or_default();
    let yl = sc
        .plot
        .y_label
        .clone()
        .unwrap_or_else(|| metric_label(&sc.plot.y));
    (title, xl, yl)
}

/// The chart proper: caption, axes with their mesh, and each series as a line with a
/// dot at every point, in palette order.
fn draw_chart<DB: DrawingBackend>(
    sc: &Scenario,
    lines: &[Series],
    plot_area: &DrawingArea<DB, plotters::coord::Shift>,
) -> Result<(), PlotError> {
    let (x0, x1, y0, y1) = bounds(lines);
    let (title, xl, yl) = chart_texts(sc);
    // Long titles get a smaller font so they fit the width.
    let caption_size = if title.chars().count() > 60 { 14 } else { 24 };
    let mut chart = ChartBuilder::on(plot_area)
        .caption(title, ("sans-serif", caption_size))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(xl)
        .y_desc(yl)
        .label_style(("sans-serif", 14))
        .axis_desc_style(("sans-serif", 16))
        .draw()
        .map_err(err)?;
    for (i, s) in lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(
                s.points.iter().copied(),
                Color::stroke_width(&color, 2),
            ))
            .map_err(err)?;
        chart
            .draw_series(
                s.points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )
            .map_err(err)?;
    }
    Ok(())
}

/// The legend: a short line in the series colour, then its name, top to bottom.
fn draw_legend<DB: DrawingBackend>(
    lines: &[Series],
    legend_area: &DrawingArea<DB, plotters::coord::Shift>,
    legend_font: &TextStyle,
) -> Result<(), PlotError> {
    let top = 60;
    for (i, s) in lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let y = top + 24 * i as i32;
        legend_area
            .draw(&PathElement::new(
                vec![(6, y), (30, y)],
                Color::stroke_width(&color, 3),
            ))
            .map_err(err)?;
        legend_area
            .draw(&Text::new(s.name.clone(), (38, y - 7), legend_font.clone()))
            .map_err(err)?;
    }
    Ok(())
}

/// A drawing backend that renders text with a built-in 8×8 bitmap font and forwards
/// everything else to the wrapped backend.
pub struct PixelText<B>(pub B);

/// Pixels per font pixel: 8-pixel glyphs for small text, 16 for 15 px and up.
fn text_scale(size: f64) -> i32 {
    if size >= 15.0 {
        2
    } else {
        1
    }
}

fn glyph(c: char) -> [u8; 8] {
    let i = c as usize;
    match i {
        0..=127 => font8x8::legacy::BASIC_LEGACY[i],
        0xA0..=0xFF => font8x8::legacy::LATIN_LEGACY[i - 0xA0],
        _ => font8x8::legacy::BASIC_LEGACY[b'?' as usize],
    }
}

impl<B: DrawingBackend> DrawingBackend for PixelText<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        self.0.get_size()
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_pixel(point, color)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_line(from, to, style)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_rect(upper_left, bottom_right, style, fill)
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_path(path, style)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.draw_circle(center, radius, style, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.fill_polygon(vert, style)
    }

    fn blit_bitmap(
        &mut self,
        pos: BackendCoord,
        dim: (u32, u32),
        src: &[u8],
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.0.blit_bitmap(pos, dim, src)
    }

    fn estimate_text_size<TStyle: BackendTextStyle>(
        &self,
        text: &str,
        style: &TStyle,
    ) -> Result<(u32, u32), DrawingErrorKind<Self::ErrorType>> {
        let s = text_scale(style.size()) as u32;
        Ok((8 * s * text.chars().count() as u32, 8 * s))
    }

    fn draw_text<TStyle: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &TStyle,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let color = style.color();
        if color.alpha == 0.0 {
            return Ok(());
        }
        let s = text_scale(style.size());
        let width = 8 * s * text.chars().count() as i32;
        let height = 8 * s;
        let dx = match style.anchor().h_pos {
            HPos::Left => 0,
            HPos::Right => -width,
            HPos::Center => -width / 2,
        };
        let dy = match style.anchor().v_pos {
            VPos::Top => 0,
            VPos::Center => -height / 2,
            VPos::Bottom => -height,
        };
        let trans = style.transform();
        let (w, h) = self.get_size();
        for (ci, c) in text.chars().enumerate() {
            let g = glyph(c);
            for (row, bits) in g.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) == 0 {
                        continue;
                    }
                    for sy in 0..s {
                        for sx in 0..s {
                            let lx = ci as i32 * 8 * s + col * s + sx + dx;
                            let ly = row as i32 * s + sy + dy;
                            let (tx, ty) = trans.transform(lx, ly);
                            let (x, y) = (pos.0 + tx, pos.1 + ty);
                            if x >= 0 && y >= 0 && x < w as i32 && y < h as i32 {
                                self.0.draw_pixel((x, y), color)?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plot_paths_are_checked_and_a_missing_folder_is_named() {
        let dir = std::env::temp_dir().join(format!("braid-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = |p: &Path| check_path("--plot", p).unwrap_err();
        let missing = dir.join("results/fig.svg");
        let m = e(&missing);
        assert!(
            m.contains(&format!(
                "the folder '{}' does not exist",
                dir.join("results").display()
            )) && m.contains("mkdir -p"),
            "{m}"
        );
        assert!(!dir.join("results").exists(), "the folder was created");
        assert!(e(&dir.join("fig.pdf")).contains("must end in .svg or .png"));
        let file = dir.join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(e(&file.join("fig.svg")).contains("is not a folder"));
        let folder = dir.join("looks.svg");
        std::fs::create_dir_all(&folder).unwrap();
        assert!(e(&folder).contains("is a folder"));
        assert!(matches!(
            check_path("--plot", &dir.join("fig.PNG")),
            Ok(Format::Png)
        ));
        assert!(matches!(
            check_path("--plot", Path::new("fig.svg")),
            Ok(Format::Svg)
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn format_from_extension() {
        assert_eq!(Format::from_path(Path::new("a.SVG")), Some(Format::Svg));
        assert_eq!(Format::from_path(Path::new("x/b.png")), Some(Format::Png));
        assert_eq!(Format::from_path(Path::new("c.pdf")), None);
        assert_eq!(Format::from_path(Path::new("noext")), None);
    }
}
