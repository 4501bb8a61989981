//! Progress bars for long conversions and verifications, on stderr.

/// A byte-count progress bar that stays silent when disabled.
pub struct ByteBar {
    bar: Option<indicatif::ProgressBar>,
    label: &'static str,
}

impl ByteBar {
    /// A bar labelled `label`; hidden unless `enabled`.
    pub fn new(label: &'static str, enabled: bool) -> Self {
        Self {
            bar: None,
            label: if enabled { label } else { "" },
        }
    }

    /// Moves the bar to `done` of `total` bytes, showing `item`.
    pub fn update(&mut self, done: u64, total: u64, item: &str) {
        if self.label.is_empty() {
            return;
        }
        let label = self.label;
        let bar = self.bar.get_or_insert_with(|| {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {wide_msg}",
                )
                .expect("static template")
                .progress_chars("=> "),
            );
            bar.set_prefix(label);
            bar
        });
        bar.set_position(done);
        bar.set_message(item.to_string());
    }
}

impl Drop for ByteBar {
    fn drop(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}
