//! Inline SVG charts for the HTML report: line, marker and bar series on linear axes with
//! "nice" ticks, labelled axes, a legend and shaded bands (sweep levels). No script: the
//! page's stylesheet colours the classes, so one chart serves light, dark and print.

use std::fmt::Write as _;

use super::escape::esc;

/// Width of every chart in SVG user units (it scales to its container).
const WIDTH: f64 = 640.0;
const MARGIN_LEFT: f64 = 64.0;
const MARGIN_RIGHT: f64 = 18.0;
const MARGIN_TOP: f64 = 34.0;
const MARGIN_BOTTOM: f64 = 46.0;

/// One chart.
pub(super) struct Chart {
    /// The element id of its `<figure>` (`plot-ttft-cdf`).
    pub id: &'static str,
    /// Caption and accessible title.
    pub title: String,
    /// X axis label, with its unit.
    pub x_label: String,
    /// Y axis label, with its unit.
    pub y_label: String,
    pub series: Vec<Series>,
    /// Shaded x ranges with a label at their top (sweep levels).
    pub bands: Vec<Band>,
    /// Fixed y range (a CDF's 0–100 %); otherwise from 0 (or the data's minimum when
    /// negative) to the data's maximum.
    pub y_range: Option<(f64, f64)>,
    /// Upper end of the x axis when the data should be cut (a CDF's far tail); the data
    /// beyond is clipped.
    pub x_max: Option<f64>,
    /// Height in SVG user units.
    pub height: f64,
}

/// One series of a chart.
pub(super) struct Series {
    /// Legend text.
    pub name: String,
    /// Colour index: `s0`…`s4`, or [`BASELINE_COLOR`].
    pub color: usize,
    pub dashed: bool,
    pub kind: SeriesKind,
    /// Connected runs of `(x, y)` points; a gap between two runs is not drawn.
    pub segments: Vec<Vec<(f64, f64)>>,
}

/// How a series is drawn.
pub(super) enum SeriesKind {
    /// A polyline.
    Line,
    /// A polyline with a marker and a label at each point (the labels in point order).
    Labelled(Vec<String>),
    /// A bar per point, `x` its right edge and the width given per point.
    Bars(Vec<f64>),
}

/// A shaded x range.
pub(super) struct Band {
    pub from: f64,
    pub to: f64,
    pub label: String,
}

/// The colour index of a baseline series (grey).
pub(super) const BASELINE_COLOR: usize = 9;

impl Series {
    /// A solid line.
    pub fn line(name: impl Into<String>, color: usize, segments: Vec<Vec<(f64, f64)>>) -> Series {
        Series {
            name: name.into(),
            color,
            dashed: false,
            kind: SeriesKind::Line,
            segments,
        }
    }
}

impl Chart {
    /// True when no series has a point.
    pub fn is_empty(&self) -> bool {
        self.series
            .iter()
            .all(|s| s.segments.iter().all(Vec::is_empty))
    }

    /// The chart as a `<figure>` holding an inline `<svg>`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let id = self.id;
        let (w, h) = (WIDTH, self.height);
        let plot_w = w - MARGIN_LEFT - MARGIN_RIGHT;
        let plot_h = h - MARGIN_TOP - MARGIN_BOTTOM;
        let _ = write!(
            out,
            "<figure class=\"plot\" id=\"{id}\">\n<svg viewBox=\"0 0 {w} {h}\" role=\"img\" \
             aria-labelledby=\"{id}-title\" preserveAspectRatio=\"xMidYMid meet\">\
             <title id=\"{id}-title\">{}</title>\n",
            esc(&self.title)
        );
        if self.is_empty() {
            let _ = writeln!(
                out,
                "<text class=\"empty\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">no data</text>\n</svg>\n\
                 <figcaption>{}</figcaption>\n</figure>",
                w / 2.0,
                h / 2.0,
                esc(&self.title)
            );
            return out;
        }

        let (x_lo, x_hi) = self.x_extent();
        let (y_lo, y_hi) = self.y_extent();
        let x_axis = Axis::nice(x_lo, x_hi);
        let y_axis = match self.y_range {
            Some((lo, hi)) => Axis::fixed(lo, hi),
            None => Axis::nice(y_lo, y_hi),
        };
        let px = |x: f64| MARGIN_LEFT + (x - x_axis.lo) / (x_axis.hi - x_axis.lo) * plot_w;
        let py = |y: f64| MARGIN_TOP + plot_h - (y - y_axis.lo) / (y_axis.hi - y_axis.lo) * plot_h;

        // The clip reaches a line's half-width past the frame, so a line along an edge
        // (a CDF at 100 %) is drawn whole.
        let _ = writeln!(
            out,
            "<defs><clipPath id=\"{id}-clip\"><rect x=\"{}\" y=\"{}\" \
             width=\"{}\" height=\"{}\"/></clipPath></defs>",
            MARGIN_LEFT - 3.0,
            MARGIN_TOP - 3.0,
            plot_w + 6.0,
            plot_h + 6.0
        );
        for band in &self.bands {
            let (x0, x1) = (px(band.from.max(x_axis.lo)), px(band.to.min(x_axis.hi)));
            let _ = writeln!(
                out,
                "<rect class=\"band\" x=\"{:.1}\" y=\"{MARGIN_TOP}\" width=\"{:.1}\" height=\"{plot_h}\"/>\
                 <text class=\"band-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                x0,
                (x1 - x0).max(0.0),
                (x0 + x1) / 2.0,
                MARGIN_TOP + 11.0,
                esc(&band.label)
            );
        }
        // Grid and tick labels.
        for tick in y_axis.ticks() {
            let y = py(tick);
            let _ = writeln!(
                out,
                "<line class=\"grid\" x1=\"{MARGIN_LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>\
                 <text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                MARGIN_LEFT + plot_w,
                MARGIN_LEFT - 6.0,
                y + 4.0,
                y_axis.label(tick)
            );
        }
        for tick in x_axis.ticks() {
            let x = px(tick);
            let _ = writeln!(
                out,
                "<line class=\"grid\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{MARGIN_TOP}\" y2=\"{:.1}\"/>\
                 <text class=\"tick\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                MARGIN_TOP + plot_h,
                MARGIN_TOP + plot_h + 16.0,
                x_axis.label(tick)
            );
        }
        let _ = writeln!(
            out,
            "<rect class=\"frame\" x=\"{MARGIN_LEFT}\" y=\"{MARGIN_TOP}\" width=\"{plot_w}\" height=\"{plot_h}\"/>\n\
             <text class=\"axis-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
             <text class=\"axis-label\" transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            MARGIN_LEFT + plot_w / 2.0,
            h - 8.0,
            esc(&self.x_label),
            MARGIN_TOP + plot_h / 2.0,
            esc(&self.y_label)
        );

        let _ = writeln!(out, "<g clip-path=\"url(#{id}-clip)\">");
        for series in &self.series {
            let color = series.color;
            let dash = if series.dashed { " dashed" } else { "" };
            match &series.kind {
                SeriesKind::Bars(widths) => {
                    let points = series.segments.iter().flatten();
                    for (&(x, y), width) in points.zip(widths) {
                        let (x0, x1) = (px(x - width), px(x));
                        let (top, base) = (py(y.max(y_axis.lo)), py(y_axis.lo.max(0.0)));
                        let _ = writeln!(
                            out,
                            "<rect class=\"f{color}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\"/>",
                            x0 + 0.5,
                            top.min(base),
                            (x1 - x0 - 1.0).max(1.0),
                            (base - top).abs()
                        );
                    }
                }
                SeriesKind::Line | SeriesKind::Labelled(_) => {
                    for segment in series.segments.iter().filter(|s| !s.is_empty()) {
                        let points: Vec<String> = segment
                            .iter()
                            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                            .collect();
                        let _ = writeln!(
                            out,
                            "<polyline class=\"line s{color}{dash}\" points=\"{}\"/>",
                            points.join(" ")
                        );
                    }
                }
            }
        }
        let _ = writeln!(out, "</g>");
        // Point labels, unclipped.
        for series in &self.series {
            let color = series.color;
            if let SeriesKind::Labelled(labels) = &series.kind {
                for (&(x, y), label) in series.segments.iter().flatten().zip(labels) {
                    let _ = writeln!(
                        out,
                        "<circle class=\"f{color}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\"/>\
                         <text class=\"point-label\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                        px(x),
                        py(y),
                        px(x) + 6.0,
                        py(y) - 6.0,
                        esc(label)
                    );
                }
            }
        }

        // Legend, left to right above the plot.
        let mut x = MARGIN_LEFT;
        for series in &self.series {
            let color = series.color;
            let dash = if series.dashed { " dashed" } else { "" };
            let swatch = match series.kind {
                SeriesKind::Bars(_) => format!(
                    "<rect class=\"f{color}\" x=\"{x:.1}\" y=\"12\" width=\"18\" height=\"10\"/>"
                ),
                _ => format!(
                    "<line class=\"line s{color}{dash}\" x1=\"{x:.1}\" x2=\"{:.1}\" y1=\"17\" y2=\"17\"/>",
                    x + 18.0
                ),
            };
            let _ = writeln!(
                out,
                "{swatch}<text class=\"legend\" x=\"{:.1}\" y=\"21\">{}</text>",
                x + 23.0,
                esc(&series.name)
            );
            x += 23.0 + 6.5 * series.name.chars().count() as f64 + 16.0;
        }
        let _ = writeln!(
            out,
            "</svg>\n<figcaption>{}</figcaption>\n</figure>",
            esc(&self.title)
        );
        out
    }

    fn points(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.series
            .iter()
            .flat_map(|s| s.segments.iter().flatten().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite())
    }

    fn x_extent(&self) -> (f64, f64) {
        let mut lo = f64::INFINITY;
        let mut hi = f64::NEG_INFINITY;
        for series in &self.series {
            let widths = match &series.kind {
                SeriesKind::Bars(widths) => Some(widths),
                _ => None,
            };
            for (i, &(x, _)) in series.segments.iter().flatten().enumerate() {
                let left = widths.and_then(|w| w.get(i)).map_or(x, |w| x - w);
                lo = lo.min(left);
                hi = hi.max(x);
            }
        }
        for band in &self.bands {
            lo = lo.min(band.from);
            hi = hi.max(band.to);
        }
        // Times, throughputs and latencies start at zero.
        lo = lo.min(0.0);
        if let Some(max) = self.x_max {
            hi = hi.min(max);
        }
        // Room for the labels right of the last points.
        if self
            .series
            .iter()
            .any(|s| matches!(s.kind, SeriesKind::Labelled(_)))
        {
            hi += (hi - lo) * 0.08;
        }
        (lo, hi)
    }

    fn y_extent(&self) -> (f64, f64) {
        let x_max = self.x_max.unwrap_or(f64::INFINITY);
        let (lo, hi) = self
            .points()
            .filter(|&(x, _)| x <= x_max)
            .fold((0.0f64, f64::NEG_INFINITY), |(lo, hi), (_, y)| {
                (lo.min(y), hi.max(y))
            });
        // A little headroom, so the highest point does not sit on the frame.
        (lo, if hi.is_finite() { hi * 1.05 } else { 1.0 })
    }
}

/// A linear axis from `lo` to `hi` with ticks every `step`.
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
    decimals: usize,
}

impl Axis {
    /// Round `lo` and `hi` out to about five "nice" steps (1, 2, 2.5 or 5 × 10ⁿ).
    fn nice(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = if hi > lo {
            (lo, hi)
        } else if hi == 0.0 {
            (0.0, 1.0)
        } else {
            (lo.min(0.0), hi.abs() * 1.1)
        };
        let raw = (hi - lo) / 5.0;
        let magnitude = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 2.5, 5.0, 10.0]
            .into_iter()
            .map(|m| m * magnitude)
            .find(|s| *s >= raw)
            .unwrap_or(10.0 * magnitude);
        Axis {
            lo: (lo / step).floor() * step,
            hi: (hi / step).ceil() * step,
            step,
            decimals: decimals_of(step),
        }
    }

    fn fixed(lo: f64, hi: f64) -> Axis {
        let step = (hi - lo) / 4.0;
        Axis {
            lo,
            hi,
            step,
            decimals: decimals_of(step),
        }
    }

    fn ticks(&self) -> impl Iterator<Item = f64> + '_ {
        let count = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=count.min(50)).map(move |i| self.lo + i as f64 * self.step)
    }

    fn label(&self, value: f64) -> String {
        format!("{value:.*}", self.decimals)
    }
}

/// Decimals needed to tell ticks `step` apart (2.5 needs one more than 2).
fn decimals_of(step: f64) -> usize {
    let mut decimals = 0;
    let mut scaled = step;
    while decimals < 6 && (scaled - scaled.round()).abs() > 1e-9 * scaled.abs().max(1.0) {
        scaled *= 10.0;
        decimals += 1;
    }
    decimals
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_axes_round_out_to_readable_steps() {
        let axis = Axis::nice(0.0, 173.0);
        assert_eq!((axis.lo, axis.hi, axis.step), (0.0, 200.0, 50.0));
        assert_eq!(axis.ticks().count(), 5);
        let axis = Axis::nice(0.0, 0.9);
        assert_eq!((axis.step, axis.decimals), (0.2, 1));
        assert_eq!(axis.label(0.4), "0.4");
        let axis = Axis::nice(0.0, 11.0);
        assert_eq!((axis.step, axis.decimals), (2.5, 1));
        // A flat series still gets an axis.
        let axis = Axis::nice(0.0, 0.0);
        assert!(axis.hi > axis.lo);
    }

    #[test]
    fn a_chart_escapes_its_text_and_clips_its_series() {
        let chart = Chart {
            id: "plot-test",
            title: "TTFT <b>".into(),
            x_label: "ms".into(),
            y_label: "%".into(),
            series: vec![Series::line(
                "run \"a\"",
                0,
                vec![vec![(0.0, 0.0), (10.0, 50.0), (1000.0, 100.0)]],
            )],
            bands: vec![Band {
                from: 0.0,
                to: 5.0,
                label: "c=<1>".into(),
            }],
            y_range: Some((0.0, 100.0)),
            x_max: Some(20.0),
            height: 300.0,
        };
        let svg = chart.render();
        assert!(svg.contains("TTFT &lt;b&gt;") && !svg.contains("<b>"));
        assert!(svg.contains("run &quot;a&quot;") && svg.contains("c=&lt;1&gt;"));
        assert!(svg.contains("clip-path=\"url(#plot-test-clip)\""));
        assert!(svg.contains("<polyline class=\"line s0\""));
        // The x axis stops at the cut, not at the far tail.
        assert!(
            svg.contains(">20</text>") && !svg.contains(">1000</text>"),
            "{svg}"
        );
    }

    #[test]
    fn an_empty_chart_says_so() {
        let chart = Chart {
            id: "plot-empty",
            title: "nothing".into(),
            x_label: String::new(),
            y_label: String::new(),
            series: vec![Series::line("x", 0, vec![Vec::new()])],
            bands: Vec::new(),
            y_range: None,
            x_max: None,
            height: 200.0,
        };
        assert!(chart.is_empty());
        assert!(chart.render().contains("no data"));
    }
}
