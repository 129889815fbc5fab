//! Inline SVG charts for the HTML report: line, marker and bar series on linear axes with
//! "nice" ticks (or a logarithmic x axis, for loads spanning decades), labelled axes, a
//! legend, shaded bands (sweep levels) and labelled reference lines (a goal's limit, the
//! capacity found). No script: the page's stylesheet colours the classes, so one chart
//! serves light, dark and print.

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
    pub id: String,
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
    /// A logarithmic x axis (every x must then be above 0; others are not drawn).
    pub x_log: bool,
    /// Labelled reference lines across the plot.
    pub rules: Vec<Rule>,
}

/// A labelled dashed line across the plot: a limit (horizontal) or a load (vertical).
pub(super) struct Rule {
    /// Where it is.
    pub at: RuleAt,
    /// Text beside it.
    pub label: String,
    /// Colour index, as a series'.
    pub color: usize,
}

/// Which way a [`Rule`] runs, and where.
pub(super) enum RuleAt {
    /// Across the plot at this y.
    Horizontal(f64),
    /// Up the plot at this x.
    Vertical(f64),
}

/// The shape of a [`SeriesKind::Markers`] point.
#[derive(Clone, Copy)]
pub(super) enum Marker {
    /// A filled disc.
    Circle,
    /// An ×.
    Cross,
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
    /// A marker at each point, unconnected, with a label right of it where the label (in
    /// point order) is not empty (a value drawn at the plot's edge because it is off the
    /// scale).
    Markers(Marker, Vec<String>),
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
        let id = esc(&self.id);
        let (w, h) = (WIDTH, self.height);
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
        let plot = self.plot();
        // The clip reaches a line's half-width past the frame, so a line along an edge
        // (a CDF at 100 %) is drawn whole.
        let _ = writeln!(
            out,
            "<defs><clipPath id=\"{id}-clip\"><rect x=\"{}\" y=\"{}\" \
             width=\"{}\" height=\"{}\"/></clipPath></defs>",
            MARGIN_LEFT - 3.0,
            MARGIN_TOP - 3.0,
            plot.w + 6.0,
            plot.h + 6.0
        );
        self.write_bands(&mut out, &plot);
        self.write_grid(&mut out, &plot);
        let _ = writeln!(out, "<g clip-path=\"url(#{id}-clip)\">");
        self.write_series(&mut out, &plot);
        self.write_rules(&mut out, &plot);
        let _ = writeln!(out, "</g>");
        self.write_rule_labels(&mut out, &plot);
        self.write_markers(&mut out, &plot);
        self.write_point_labels(&mut out, &plot);
        self.write_legend(&mut out);
        let _ = writeln!(
            out,
            "</svg>\n<figcaption>{}</figcaption>\n</figure>",
            esc(&self.title)
        );
        out
    }

    /// The plot area and its axes, from the data's extent (or the fixed range).
    fn plot(&self) -> Plot {
        let (x_lo, x_hi) = self.x_extent();
        let (y_lo, y_hi) = self.y_extent();
        Plot {
            x_axis: if self.x_log {
                Axis::log(x_lo, x_hi)
            } else {
                Axis::nice(x_lo, x_hi)
            },
            y_axis: match self.y_range {
                Some((lo, hi)) => Axis::fixed(lo, hi),
                None => Axis::nice(y_lo, y_hi),
            },
            w: WIDTH - MARGIN_LEFT - MARGIN_RIGHT,
            h: self.height - MARGIN_TOP - MARGIN_BOTTOM,
            x_log: self.x_log,
        }
    }

    fn write_bands(&self, out: &mut String, plot: &Plot) {
        for band in &self.bands {
            let (x0, x1) = (
                plot.px(band.from.max(plot.x_axis.lo)),
                plot.px(band.to.min(plot.x_axis.hi)),
            );
            let _ = writeln!(
                out,
                "<rect class=\"band\" x=\"{:.1}\" y=\"{MARGIN_TOP}\" width=\"{:.1}\" height=\"{}\"/>\
                 <text class=\"band-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                x0,
                (x1 - x0).max(0.0),
                plot.h,
                (x0 + x1) / 2.0,
                MARGIN_TOP + 11.0,
                esc(&band.label)
            );
        }
    }

    /// Grid lines, tick labels, the frame and the axis labels.
    fn write_grid(&self, out: &mut String, plot: &Plot) {
        let (plot_w, plot_h) = (plot.w, plot.h);
        for tick in plot.y_axis.ticks() {
            let y = plot.py(tick);
            let _ = writeln!(
                out,
                "<line class=\"grid\" x1=\"{MARGIN_LEFT}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>\
                 <text class=\"tick\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                MARGIN_LEFT + plot_w,
                MARGIN_LEFT - 6.0,
                y + 4.0,
                plot.y_axis.label(tick)
            );
        }
        for tick in plot.x_axis.ticks() {
            let x = plot.px(tick);
            let _ = writeln!(
                out,
                "<line class=\"grid\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{MARGIN_TOP}\" y2=\"{:.1}\"/>\
                 <text class=\"tick\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                MARGIN_TOP + plot_h,
                MARGIN_TOP + plot_h + 16.0,
                plot.x_axis.label(tick)
            );
        }
        let _ = writeln!(
            out,
            "<rect class=\"frame\" x=\"{MARGIN_LEFT}\" y=\"{MARGIN_TOP}\" width=\"{plot_w}\" height=\"{plot_h}\"/>\n\
             <text class=\"axis-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
             <text class=\"axis-label\" transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
            MARGIN_LEFT + plot_w / 2.0,
            self.height - 8.0,
            esc(&self.x_label),
            MARGIN_TOP + plot_h / 2.0,
            esc(&self.y_label)
        );
    }

    /// Bars and lines (clipped; markers are drawn later, unclipped).
    fn write_series(&self, out: &mut String, plot: &Plot) {
        for series in &self.series {
            let color = series.color;
            let dash = if series.dashed { " dashed" } else { "" };
            match &series.kind {
                SeriesKind::Bars(widths) => {
                    let points = series.segments.iter().flatten();
                    for (&(x, y), width) in points.zip(widths) {
                        let (x0, x1) = (plot.px(x - width), plot.px(x));
                        let (top, base) = (
                            plot.py(y.max(plot.y_axis.lo)),
                            plot.py(plot.y_axis.lo.max(0.0)),
                        );
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
                SeriesKind::Markers(..) => {}
                SeriesKind::Line | SeriesKind::Labelled(_) => {
                    for segment in series.segments.iter().filter(|s| !s.is_empty()) {
                        let points: Vec<String> = segment
                            .iter()
                            .filter(|&&(x, _)| plot.drawable(x))
                            .map(|&(x, y)| format!("{:.1},{:.1}", plot.px(x), plot.py(y)))
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
    }

    fn write_rules(&self, out: &mut String, plot: &Plot) {
        for rule in &self.rules {
            let color = rule.color;
            let _ = match rule.at {
                RuleAt::Horizontal(y) => writeln!(
                    out,
                    "<line class=\"line rule s{color} dashed\" x1=\"{MARGIN_LEFT}\" x2=\"{:.1}\" \
                     y1=\"{:.1}\" y2=\"{:.1}\"/>",
                    MARGIN_LEFT + plot.w,
                    plot.py(y),
                    plot.py(y)
                ),
                RuleAt::Vertical(x) if plot.drawable(x) => writeln!(
                    out,
                    "<line class=\"line rule s{color} dashed\" x1=\"{:.1}\" x2=\"{:.1}\" \
                     y1=\"{MARGIN_TOP}\" y2=\"{:.1}\"/>",
                    plot.px(x),
                    plot.px(x),
                    MARGIN_TOP + plot.h
                ),
                RuleAt::Vertical(_) => Ok(()),
            };
        }
    }

    /// Rule labels, unclipped: a limit's at the right end above its line, a load's at the top
    /// beside its line (on the side with room).
    fn write_rule_labels(&self, out: &mut String, plot: &Plot) {
        for rule in &self.rules {
            let (x, y, anchor) = match rule.at {
                RuleAt::Horizontal(y) => (MARGIN_LEFT + plot.w - 4.0, plot.py(y) - 5.0, "end"),
                RuleAt::Vertical(x) if plot.drawable(x) => {
                    if plot.px(x) > MARGIN_LEFT + plot.w * 0.75 {
                        (plot.px(x) - 5.0, MARGIN_TOP + 13.0, "end")
                    } else {
                        (plot.px(x) + 5.0, MARGIN_TOP + 13.0, "start")
                    }
                }
                RuleAt::Vertical(_) => continue,
            };
            let _ = writeln!(
                out,
                "<text class=\"rule-label\" x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\">{}</text>",
                esc(&rule.label)
            );
        }
    }

    /// Markers, unclipped, each with its label.
    fn write_markers(&self, out: &mut String, plot: &Plot) {
        for series in &self.series {
            let SeriesKind::Markers(marker, labels) = &series.kind else {
                continue;
            };
            for (i, &(x, y)) in series.segments.iter().flatten().enumerate() {
                if !(plot.drawable(x) && y.is_finite()) {
                    continue;
                }
                out.push_str(&marker_svg(*marker, series.color, plot.px(x), plot.py(y)));
                if let Some(label) = labels.get(i).filter(|l| !l.is_empty()) {
                    let _ = write!(
                        out,
                        "<text class=\"point-label\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                        plot.px(x) + 7.0,
                        plot.py(y) + 4.0,
                        esc(label)
                    );
                }
                out.push('\n');
            }
        }
    }

    /// Labelled points, unclipped.
    fn write_point_labels(&self, out: &mut String, plot: &Plot) {
        for series in &self.series {
            let color = series.color;
            let SeriesKind::Labelled(labels) = &series.kind else {
                continue;
            };
            for (&(x, y), label) in series.segments.iter().flatten().zip(labels) {
                let _ = writeln!(
                    out,
                    "<circle class=\"f{color}\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\"/>\
                     <text class=\"point-label\" x=\"{:.1}\" y=\"{:.1}\">{}</text>",
                    plot.px(x),
                    plot.py(y),
                    plot.px(x) + 6.0,
                    plot.py(y) - 6.0,
                    esc(label)
                );
            }
        }
    }

    /// The legend, left to right above the plot.
    fn write_legend(&self, out: &mut String) {
        let mut x = MARGIN_LEFT;
        for series in &self.series {
            let color = series.color;
            let dash = if series.dashed { " dashed" } else { "" };
            let swatch = match series.kind {
                SeriesKind::Bars(_) => format!(
                    "<rect class=\"f{color}\" x=\"{x:.1}\" y=\"12\" width=\"18\" height=\"10\"/>"
                ),
                SeriesKind::Markers(marker, _) => marker_svg(marker, color, x + 9.0, 17.0),
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
                if self.x_log && x <= 0.0 {
                    continue;
                }
                let left = widths.and_then(|w| w.get(i)).map_or(x, |w| x - w);
                lo = lo.min(left);
                hi = hi.max(x);
            }
        }
        for band in &self.bands {
            lo = lo.min(band.from);
            hi = hi.max(band.to);
        }
        for rule in &self.rules {
            if let RuleAt::Vertical(x) = rule.at
                && x.is_finite()
                && (!self.x_log || x > 0.0)
            {
                lo = lo.min(x);
                hi = hi.max(x);
            }
        }
        if self.x_log {
            // The log axis rounds out to whole decades itself.
            return (lo, hi);
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
        let limits = self.rules.iter().filter_map(|rule| match rule.at {
            RuleAt::Horizontal(y) if y.is_finite() => Some(y),
            _ => None,
        });
        let (lo, hi) = self
            .points()
            .filter(|&(x, _)| x <= x_max)
            .map(|(_, y)| y)
            .chain(limits)
            .fold((0.0f64, f64::NEG_INFINITY), |(lo, hi), y| {
                (lo.min(y), hi.max(y))
            });
        // A little headroom, so the highest point does not sit on the frame.
        (lo, if hi.is_finite() { hi * 1.05 } else { 1.0 })
    }
}

/// A marker centred at `(x, y)` (SVG units).
/// A chart's plot area: its axes and size, and data → pixel.
struct Plot {
    x_axis: Axis,
    y_axis: Axis,
    w: f64,
    h: f64,
    x_log: bool,
}

impl Plot {
    fn px(&self, x: f64) -> f64 {
        MARGIN_LEFT + self.x_axis.fraction(x) * self.w
    }

    fn py(&self, y: f64) -> f64 {
        MARGIN_TOP + self.h - self.y_axis.fraction(y) * self.h
    }

    /// A point a log axis can place.
    fn drawable(&self, x: f64) -> bool {
        !self.x_log || x > 0.0
    }
}

fn marker_svg(marker: Marker, color: usize, x: f64, y: f64) -> String {
    match marker {
        Marker::Circle => {
            format!("<circle class=\"marker f{color}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4.5\"/>")
        }
        Marker::Cross => format!(
            "<path class=\"marker line s{color}\" d=\"M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}\"/>",
            x - 4.5,
            y - 4.5,
            x + 4.5,
            y + 4.5,
            x - 4.5,
            y + 4.5,
            x + 4.5,
            y - 4.5
        ),
    }
}

/// An axis from `lo` to `hi`: linear with ticks every `step`, or logarithmic (`log`) from
/// one whole decade to another with ticks at 1, 2 and 5 × 10ⁿ (at 10ⁿ alone past three
/// decades).
struct Axis {
    lo: f64,
    hi: f64,
    step: f64,
    decimals: usize,
    log: bool,
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
            log: false,
        }
    }

    fn fixed(lo: f64, hi: f64) -> Axis {
        let step = (hi - lo) / 4.0;
        Axis {
            lo,
            hi,
            step,
            decimals: decimals_of(step),
            log: false,
        }
    }

    /// A logarithmic axis over whole decades around `lo`..`hi` (both above 0; anything else
    /// gets 1..10).
    fn log(lo: f64, hi: f64) -> Axis {
        let (lo, hi) = if lo > 0.0 && hi >= lo && hi.is_finite() {
            (lo, hi)
        } else {
            (1.0, 10.0)
        };
        let lo_exp = lo.log10().floor();
        let hi_exp = hi.log10().ceil().max(lo_exp + 1.0);
        Axis {
            lo: 10f64.powf(lo_exp),
            hi: 10f64.powf(hi_exp),
            step: 1.0,
            decimals: 0,
            log: true,
        }
    }

    /// Where `value` falls between `lo` (0) and `hi` (1).
    fn fraction(&self, value: f64) -> f64 {
        if self.log {
            (value.log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (value - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (lo_exp, hi_exp) = (self.lo.log10().round(), self.hi.log10().round());
            let multiples: &[f64] = if hi_exp - lo_exp <= 3.0 {
                &[1.0, 2.0, 5.0]
            } else {
                &[1.0]
            };
            let mut ticks = Vec::new();
            let mut exp = lo_exp;
            while exp <= hi_exp {
                for m in multiples {
                    let tick = m * 10f64.powf(exp);
                    if tick <= self.hi * (1.0 + 1e-9) {
                        ticks.push(tick);
                    }
                }
                exp += 1.0;
            }
            return ticks;
        }
        let count = ((self.hi - self.lo) / self.step).round() as usize;
        (0..=count.min(50))
            .map(|i| self.lo + i as f64 * self.step)
            .collect()
    }

    fn label(&self, value: f64) -> String {
        if self.log {
            // Decimals enough for 0.01, none from 1 up.
            let decimals = (-value.log10().floor()).max(0.0) as usize;
            return format!("{value:.decimals$}");
        }
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
        assert_eq!(axis.ticks().len(), 5);
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
            id: "plot-test".into(),
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
            x_log: false,
            rules: Vec::new(),
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
            id: "plot-empty".into(),
            title: "nothing".into(),
            x_label: String::new(),
            y_label: String::new(),
            series: vec![Series::line("x", 0, vec![Vec::new()])],
            bands: Vec::new(),
            y_range: None,
            x_max: None,
            height: 200.0,
            x_log: false,
            rules: Vec::new(),
        };
        assert!(chart.is_empty());
        assert!(chart.render().contains("no data"));
    }

    #[test]
    fn a_log_axis_spans_whole_decades_with_readable_ticks() {
        let axis = Axis::log(1.0, 4096.0);
        assert_eq!((axis.lo, axis.hi), (1.0, 10_000.0));
        // Four decades: powers of ten only.
        assert_eq!(axis.ticks(), vec![1.0, 10.0, 100.0, 1_000.0, 10_000.0]);
        assert!((axis.fraction(100.0) - 0.5).abs() < 1e-12);
        let axis = Axis::log(0.1, 30.0);
        assert_eq!((axis.lo, axis.hi), (0.1, 100.0));
        assert_eq!(axis.ticks()[..4], [0.1, 0.2, 0.5, 1.0]);
        assert_eq!(axis.label(0.2), "0.2");
        assert_eq!(axis.label(50.0), "50");
        // Nothing usable still gives an axis.
        let axis = Axis::log(0.0, 0.0);
        assert!(axis.hi > axis.lo && axis.lo > 0.0);
    }

    #[test]
    fn markers_and_rules_are_drawn_and_fit_the_axes() {
        let chart = Chart {
            id: "plot-knee".into(),
            title: "knee".into(),
            x_label: "concurrency".into(),
            y_label: "ms".into(),
            series: vec![
                Series {
                    name: "passed".into(),
                    color: 2,
                    dashed: false,
                    kind: SeriesKind::Markers(Marker::Circle, Vec::new()),
                    segments: vec![vec![(1.0, 10.0), (16.0, 50.0)]],
                },
                Series {
                    name: "failed".into(),
                    color: 4,
                    dashed: false,
                    kind: SeriesKind::Markers(Marker::Cross, vec!["↑ 4096".into()]),
                    segments: vec![vec![(4096.0, 900.0)]],
                },
            ],
            bands: Vec::new(),
            y_range: None,
            x_max: None,
            height: 300.0,
            x_log: true,
            rules: vec![
                Rule {
                    at: RuleAt::Horizontal(1200.0),
                    label: "limit <1200>".into(),
                    color: 4,
                },
                Rule {
                    at: RuleAt::Vertical(16.0),
                    label: "max 16".into(),
                    color: 2,
                },
            ],
        };
        let svg = chart.render();
        // Two discs and a cross on the plot, one of each in the legend.
        assert_eq!(
            svg.matches("<circle class=\"marker f2\"").count(),
            3,
            "{svg}"
        );
        assert_eq!(svg.matches("<path class=\"marker line s4\"").count(), 2);
        assert_eq!(svg.matches("class=\"line rule").count(), 2);
        assert!(svg.contains("limit &lt;1200&gt;") && svg.contains(">max 16</text>"));
        assert!(svg.contains(">↑ 4096</text>"), "{svg}");
        // The limit above every point still fits the y axis; the log x axis reaches 10⁴.
        assert!(
            svg.contains(">1250</text>") || svg.contains(">1500</text>"),
            "{svg}"
        );
        assert!(svg.contains(">10000</text>"), "{svg}");
    }
}
