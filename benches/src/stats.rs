//! Medians with their range, and per-round paired ratios.

use serde::{Deserialize, Serialize};

/// Median, minimum and maximum of a set of measurements.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Stats {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stats {
    /// `None` when `values` is empty or holds a NaN.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Stats> {
        let mut v: Vec<f64> = values.into_iter().collect();
        if v.is_empty() || v.iter().any(|x| x.is_nan()) {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Stats {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    /// `median (min–max)` with `digits` decimals.
    pub fn show(&self, digits: usize) -> String {
        if self.n == 1 {
            return format!("{:.*}", digits, self.median);
        }
        format!(
            "{:.*} ({:.*}–{:.*})",
            digits, self.median, digits, self.min, digits, self.max
        )
    }
}

/// Per-round ratios `num[r] / den[r]` over the rounds both have.
pub fn paired(num: &[(usize, f64)], den: &[(usize, f64)]) -> Option<Stats> {
    Stats::of(
        num.iter()
            .filter_map(|&(round, n)| den.iter().find(|&&(r, _)| r == round).map(|&(_, d)| n / d)),
    )
}

/// A byte count in MiB, for tables.
pub fn mib(bytes: f64) -> String {
    format!("{:.0} MiB", bytes / (1u64 << 20) as f64)
}

/// A byte count in GiB, for tables.
pub fn gib(bytes: f64) -> String {
    format!("{:.2} GiB", bytes / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_an_even_count_is_the_mean_of_the_middle_two() {
        let s = Stats::of([4.0, 1.0, 3.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.5, 1.0, 4.0, 4));
    }

    #[test]
    fn paired_ratios_match_rounds_not_positions() {
        let num = [(0, 10.0), (1, 30.0)];
        let den = [(1, 10.0), (0, 5.0)];
        let s = paired(&num, &den).unwrap();
        assert_eq!((s.min, s.max), (2.0, 3.0));
    }
}
