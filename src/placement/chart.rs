//! The simulator's comparison chart: an SVG drawn with plotters.
//!
//! A title and a subtitle (the node and task sets and their sizes), then two panels with the
//! legend in a column of its own at their right, outside both plotting areas. Above, one group
//! of bars per measure (broken nodes %, broken assignments %, scheduled %, utilisation % per
//! dimension and their mean), one bar per algorithm. Below, the balance of each algorithm, each bar labelled with its value; the axis
//! stops at −1, so a balance far below (NOP's) is cut there but its label tells the value.
//! Colours are Okabe and Ito's colour-blind-safe palette (and four more, [`PALETTE`]).

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use verwalter_placement::report::Run;

const WIDTH: u32 = 1600;
const HEIGHT: u32 = 860;

/// The chart as SVG text; `subtitle` goes under the title (the node and task sets).
pub(crate) fn svg(runs: &[Run], subtitle: &str) -> Result<String, String> {
    let mut out = String::new();
    draw(&mut out, runs, subtitle).map_err(|e| format!("drawing the chart: {e}"))?;
    Ok(out)
}

type DrawResult = Result<(), Box<dyn std::error::Error>>;

/// The measures of the upper panel: label and value per report.
fn measures(runs: &[Run]) -> Vec<(String, Vec<f64>)> {
    let mut out = vec![
        (
            "broken nodes %".to_string(),
            runs.iter().map(|r| r.report.broken_nodes_pct).collect(),
        ),
        (
            "broken assign. %".into(),
            runs.iter()
                .map(|r| r.report.broken_assignments_pct)
                .collect(),
        ),
        (
            "scheduled %".into(),
            runs.iter().map(|r| r.report.scheduled_pct).collect(),
        ),
    ];
    let dims: std::collections::BTreeSet<_> = runs
        .iter()
        .flat_map(|r| r.report.utilisation_pct.keys().copied())
        .collect();
    for dim in dims {
        out.push((
            format!("{dim} util %"),
            runs.iter()
                .map(|r| r.report.utilisation_pct.get(&dim).copied().unwrap_or(0.0))
                .collect(),
        ));
    }
    out.push((
        "mean util %".into(),
        runs.iter().map(|r| r.report.utilisation_mean_pct).collect(),
    ));
    out
}

/// Okabe and Ito's colour-blind-safe palette (orange, sky blue, bluish green, yellow, blue,
/// vermillion, reddish purple, black), then four more that stay as far apart from them for
/// protanopes, deuteranopes and tritanopes as those do from each other (wine, brown, indigo,
/// pink; the test of the chart measures it); past twelve algorithms the colours repeat.
const PALETTE: [RGBColor; 12] = [
    RGBColor(0xE6, 0x9F, 0x00),
    RGBColor(0x56, 0xB4, 0xE9),
    RGBColor(0x00, 0x9E, 0x73),
    RGBColor(0xF0, 0xE4, 0x42),
    RGBColor(0x00, 0x72, 0xB2),
    RGBColor(0xD5, 0x5E, 0x00),
    RGBColor(0xCC, 0x79, 0xA7),
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0x88, 0x22, 0x55),
    RGBColor(0x66, 0x11, 0x00),
    RGBColor(0x33, 0x22, 0x88),
    RGBColor(0xFF, 0xAA, 0xBB),
];

fn color(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Height of the title and subtitle band above both panels.
const HEADER: u32 = 64;
/// Width of the legend's column, right of both panels (outside their plotting areas).
const LEGEND_WIDTH: u32 = 230;
/// Height of one legend row.
const LEGEND_ROW: u32 = 22;

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw(out: &mut String, runs: &[Run], subtitle: &str) -> DrawResult {
    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(HEADER);
    let centred = |size| {
        ("sans-serif", size)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top))
    };
    header.draw_text(
        "Placement quality per algorithm",
        &centred(22),
        (WIDTH as i32 / 2, 10),
    )?;
    header.draw_text(subtitle, &centred(15), (WIDTH as i32 / 2, 38))?;
    let (panels, legend) = body.split_horizontally(WIDTH - LEGEND_WIDTH);
    let (upper, lower) = panels.split_vertically((HEIGHT - HEADER) * 60 / 100);
    draw_measures(&upper, runs)?;
    draw_balance(&lower, runs)?;
    draw_legend(&legend, runs)?;
    root.present()?;
    Ok(())
}

/// The legend in its own column: a bordered box, one colour and name per algorithm.
fn draw_legend(area: &Area<'_>, runs: &[Run]) -> DrawResult {
    let (left, top) = (8, 20);
    let width = LEGEND_WIDTH as i32 - 2 * left;
    let height = (runs.len() as u32 * LEGEND_ROW + 12) as i32;
    area.draw(&Rectangle::new(
        [(left, top), (left + width, top + height)],
        ShapeStyle::from(&BLACK).stroke_width(1),
    ))?;
    let font = ("sans-serif", 13)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    for (i, run) in runs.iter().enumerate() {
        let y = top + 6 + (i as u32 * LEGEND_ROW + LEGEND_ROW / 2) as i32;
        area.draw(&Rectangle::new(
            [(left + 10, y - 7), (left + 24, y + 7)],
            color(i).filled(),
        ))?;
        area.draw_text(&run.name, &font, (left + 32, y))?;
    }
    Ok(())
}

fn draw_measures(area: &Area<'_>, runs: &[Run]) -> DrawResult {
    let measures = measures(runs);
    let k = runs.len() as u32;
    // One slot per bar and one empty slot between groups (none after the last group).
    let per_group = k + 1;
    let last_slot = measures.len() as u32 * per_group - 2;
    let top = measures
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(100.0_f64, f64::max)
        * 1.05;
    let labels: Vec<String> = measures.iter().map(|(l, _)| l.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d((0..last_slot).into_segmented(), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(last_slot as usize + 2)
        .y_labels(8)
        .max_light_lines(1)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(s) if s % per_group == k / 2 => labels
                .get((s / per_group) as usize)
                .cloned()
                .unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("%")
        .label_style(("sans-serif", 13))
        .draw()?;
    for i in 0..runs.len() {
        let fill = color(i).filled();
        let bars = measures.iter().enumerate().map(move |(g, (_, values))| {
            let slot = g as u32 * per_group + i as u32;
            Rectangle::new(
                [
                    (SegmentValue::Exact(slot), 0.0),
                    (SegmentValue::Exact(slot + 1), values[i]),
                ],
                fill,
            )
        });
        chart.draw_series(bars)?;
    }
    Ok(())
}

fn draw_balance(area: &Area<'_>, runs: &[Run]) -> DrawResult {
    let k = runs.len() as u32;
    let lowest = runs
        .iter()
        .map(|r| r.report.balance)
        .fold(0.0_f64, f64::min)
        .max(-1.0);
    let names: Vec<String> = runs.iter().map(|r| r.name.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            "Balance (1 − variance of the node utilisations)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        // Segments 0..=k-1: one per algorithm, none left over at the right.
        .build_cartesian_2d((0..k - 1).into_segmented(), lowest..1.1)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(k as usize + 1)
        .y_labels(6)
        .max_light_lines(1)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 13))
        .draw()?;
    for (i, run) in runs.iter().enumerate() {
        let i = i as u32;
        let value = run.report.balance;
        let shown = value.max(lowest);
        // The last bar ends at the axis' end (`Last`): with one algorithm the range is the
        // single point 0, where `Exact(1)` would map onto `Exact(0)`.
        let right = if i + 1 == k {
            SegmentValue::Last
        } else {
            SegmentValue::Exact(i + 1)
        };
        let mut bar = Rectangle::new(
            [(SegmentValue::Exact(i), 0.0), (right, shown)],
            color(i as usize).filled(),
        );
        bar.set_margin(0, 0, 12, 12);
        chart.draw_series(std::iter::once(bar))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{value:.3}"),
            (SegmentValue::CenterOf(i), shown.max(0.0) + 0.04),
            ("sans-serif", 13)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Bottom)),
        )))?;
    }
    Ok(())
}
