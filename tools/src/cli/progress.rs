//! The progress bars the commands draw on stderr (hidden when stderr is not a terminal, or
//! when asked to be quiet).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar over `total` bytes, labelled with `verb`.
pub(crate) fn bytes_bar(total: u64, verb: &str, quiet: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(total),
        if quiet {
            ProgressDrawTarget::hidden()
        } else {
            ProgressDrawTarget::stderr()
        },
    );
    let style = ProgressStyle::with_template(&format!(
        "{verb} [{{bar:30}}] {{bytes}}/{{total_bytes}} {{bytes_per_sec}} eta {{eta}} {{wide_msg}}"
    ))
    .expect("the template is valid")
    .progress_chars("=> ");
    bar.set_style(style);
    bar
}
