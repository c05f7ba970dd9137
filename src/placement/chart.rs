//! The simulator's comparison chart: an SVG drawn with plotters.
//!
//! Two panels. Above, one group of bars per measure (broken nodes %, broken assignments %,
//! scheduled %, utilisation % per dimension and their mean), one bar per algorithm, with a
//! legend. Below, the balance of each algorithm, each bar labelled with its value; the axis
//! stops at −1, so a balance far below (NOP's) is cut there but its label tells the value.

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use verwalter_placement::report::Run;

const WIDTH: u32 = 1600;
const HEIGHT: u32 = 860;

/// The chart as SVG text.
pub fn svg(runs: &[Run]) -> Result<String, String> {
    let mut out = String::new();
    draw(&mut out, runs).map_err(|e| format!("drawing the chart: {e}"))?;
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

fn color(i: usize) -> RGBColor {
    // Palette99 is plotters' qualitative palette; take its RGB to fill and to mix.
    let c = Palette99::pick(i).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

fn draw(out: &mut String, runs: &[Run]) -> DrawResult {
    let root = SVGBackend::with_string(out, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(HEIGHT * 62 / 100);
    draw_measures(&upper, runs)?;
    draw_balance(&lower, runs)?;
    root.present()?;
    Ok(())
}

fn draw_measures(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    runs: &[Run],
) -> DrawResult {
    let measures = measures(runs);
    let k = runs.len() as u32;
    // One slot per bar and one empty slot between groups.
    let per_group = k + 1;
    let slots = measures.len() as u32 * per_group;
    let top = measures
        .iter()
        .flat_map(|(_, v)| v.iter().copied())
        .fold(100.0_f64, f64::max)
        * 1.05;
    let labels: Vec<String> = measures.iter().map(|(l, _)| l.clone()).collect();
    let mut chart = ChartBuilder::on(area)
        .caption("Placement quality per algorithm", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d((0..slots).into_segmented(), 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(slots as usize + 1)
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
    for (i, run) in runs.iter().enumerate() {
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
        chart
            .draw_series(bars)?
            .label(run.name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 12, y + 6)], fill));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

fn draw_balance(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    runs: &[Run],
) -> DrawResult {
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
        .build_cartesian_2d((0..k).into_segmented(), lowest..1.1)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(k as usize + 1)
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
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(i), 0.0),
                (SegmentValue::Exact(i + 1), shown),
            ],
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
