//! What the longer examples show while they train: a progress bar on the terminal (indicatif;
//! hidden when stderr is not a terminal, as under `cargo test`), and with `--plot loss.svg`
//! the loss curve as an SVG (plotters), since a curve reads faster than a column of numbers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use tessera::{Error, Result};

/// A progress bar over `total` steps, showing the latest loss.
pub fn bar(total: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed}, eta {eta})",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

/// The path after `--plot` on the command line, if any (`--plot=path` too).
pub fn plot_arg() -> Result<Option<PathBuf>> {
    plot_arg_from(std::env::args().skip(1))
}

/// `plot_arg` over the given arguments.
pub fn plot_arg_from(args: impl IntoIterator<Item = String>) -> Result<Option<PathBuf>> {
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        if a == "--plot" {
            return match args.next() {
                Some(p) => Ok(Some(PathBuf::from(p))),
                None => Err(Error::Io(
                    "--plot needs a file name: --plot loss.svg".into(),
                )),
            };
        }
        if let Some(p) = a.strip_prefix("--plot=") {
            return Ok(Some(PathBuf::from(p)));
        }
    }
    Ok(None)
}

/// Writes `losses` (one per step or epoch, `x_label` says which) as a line chart in SVG.
pub fn plot_losses(path: &Path, title: &str, x_label: &str, losses: &[f32]) -> Result<()> {
    let io = |e: String| Error::Io(format!("--plot {}: {e}", path.display()));
    if losses.is_empty() {
        return Err(io("no losses to plot".into()));
    }
    let finite: Vec<f32> = losses.iter().copied().filter(|l| l.is_finite()).collect();
    if finite.is_empty() {
        return Err(io("every loss is NaN or infinite: nothing to plot".into()));
    }
    let lo = finite.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (lo, hi) = if lo < hi {
        (lo, hi)
    } else {
        (lo - 0.5, lo + 0.5)
    };
    let pad = (hi - lo) * 0.05;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| io(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0usize..losses.len().max(2) - 1, (lo - pad)..(hi + pad))
        .map_err(|e| io(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("loss")
        .draw()
        .map_err(|e| io(e.to_string()))?;
    chart
        .draw_series(LineSeries::new(
            // A non-finite loss (a diverged step) is left out of the line.
            losses
                .iter()
                .enumerate()
                .filter(|(_, l)| l.is_finite())
                .map(|(i, &l)| (i, l)),
            &BLUE,
        ))
        .map_err(|e| io(e.to_string()))?;
    root.present().map_err(|e| io(e.to_string()))?;
    Ok(())
}
