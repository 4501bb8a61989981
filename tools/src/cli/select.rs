//! `burn-mapped select`: apply the endpoint rule to rates measured elsewhere.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::ArgGroup;

use crate::probe::ProbeReport;
use crate::select::{ArmRate, Basis, DEFAULT_THETA, SelectInput, Verdict, select};

/// Rates are decimal GB/s over the whole working set; give each arm a rate or the reason it could not
/// run, or read a probe report with `--from`.
#[derive(Clone, Debug, clap::Args)]
#[command(group(ArgGroup::new("map").args(["map_gbps", "map_unavailable"])))]
#[command(group(ArgGroup::new("resident").args(["resident_gbps", "resident_unavailable"])))]
#[command(group(ArgGroup::new("copy").args(["copy_gbps", "copy_unavailable"])))]
pub struct SelectArgs {
    /// A probe report (JSON from `probe --json` or `cuda_probe`); its rates, W, residency and
    /// coexistence replace the arguments below.
    #[arg(
        long,
        value_name = "JSON",
        conflicts_with_all = [
            "map_gbps", "map_unavailable", "resident_gbps", "resident_unavailable",
            "copy_gbps", "copy_unavailable", "working_set", "no_coexist", "storage_bound",
        ]
    )]
    pub from: Option<PathBuf>,
    /// Map endpoint rate (GB/s): reading the mapped file pages in place.
    #[arg(long, value_name = "GBPS")]
    pub map_gbps: Option<f64>,
    /// The map arm could not run, for this reason.
    #[arg(long, value_name = "REASON")]
    pub map_unavailable: Option<String>,
    /// Resident endpoint rate (GB/s): one-time copy into device-owned storage.
    #[arg(long, value_name = "GBPS")]
    pub resident_gbps: Option<f64>,
    /// The resident arm could not run, for this reason.
    #[arg(long, value_name = "REASON")]
    pub resident_unavailable: Option<String>,
    /// Per-use copy endpoint rate (GB/s): staging the bytes before every use, copy time included.
    #[arg(long, value_name = "GBPS")]
    pub copy_gbps: Option<f64>,
    /// The per-use copy arm could not run, for this reason.
    #[arg(long, value_name = "REASON")]
    pub copy_unavailable: Option<String>,
    /// Working set W: weight bytes read per token (e.g. 4683198464, 4.36GiB, 119GB).
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes, required_unless_present = "from")]
    pub working_set: Option<u64>,
    /// Device storage available to a resident copy; resident is dropped when it is smaller than W.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    pub resident_capacity: Option<u64>,
    /// The resident copy did not coexist with the cached mapping after one pass of every arm.
    #[arg(long)]
    pub no_coexist: bool,
    /// The mapping does not stay in the page cache over a pass (stop: storage-bound).
    #[arg(long)]
    pub storage_bound: bool,
    /// Tie band: map wins when its path time is within (1 + theta) of the fastest.
    #[arg(long, default_value_t = DEFAULT_THETA)]
    pub theta: f64,
    /// Print the verdict as JSON.
    #[arg(long)]
    pub json: bool,
}

impl SelectArgs {
    /// The rule's input described by these arguments (or by the `--from` report).
    ///
    /// # Errors
    /// An arm with neither a rate nor a reason, no working set, or a `--from` file that cannot be
    /// read as a probe report.
    pub fn select_input(&self) -> anyhow::Result<SelectInput> {
        if let Some(path) = &self.from {
            let mut input = read_probe_report(path)?.select_input();
            input.resident_capacity_bytes = self.resident_capacity;
            return Ok(input);
        }
        let arm = |name: &str, gbps: Option<f64>, reason: &Option<String>| match (gbps, reason) {
            (Some(gbps), _) => Ok(ArmRate::measured(gbps)),
            (None, Some(reason)) => Ok(ArmRate::unavailable(reason.clone())),
            (None, None) => Err(anyhow::anyhow!(
                "the {name} arm needs --{name}-gbps or --{name}-unavailable (or use --from)"
            )),
        };
        Ok(SelectInput {
            working_set_bytes: self
                .working_set
                .context("--working-set is required without --from")?,
            map: arm("map", self.map_gbps, &self.map_unavailable)?,
            resident: arm("resident", self.resident_gbps, &self.resident_unavailable)?,
            per_use_copy: arm("copy", self.copy_gbps, &self.copy_unavailable)?,
            resident_capacity_bytes: self.resident_capacity,
            resident_coexists: !self.no_coexist,
            mapping_stays_resident: !self.storage_bound,
        })
    }
}

/// Reads a probe report: either a bare [`ProbeReport`] or an object with one under `"probe"`
/// (what `probe --json` and `cuda_probe` print).
///
/// # Errors
/// Unreadable file, or JSON that is neither shape.
pub fn read_probe_report(path: &Path) -> anyhow::Result<ProbeReport> {
    let bytes =
        burn_mapped::untrusted::read_regular(path, burn_mapped::untrusted::Links::Follow, 64 << 20)
            .with_context(|| format!("reading {}", path.display()))?;
    let text =
        String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
    parse_probe_report(&text).with_context(|| format!("{} is not a probe report", path.display()))
}

/// [`read_probe_report`] on text.
///
/// # Errors
/// JSON that is neither a report nor an object holding one under `"probe"`.
pub fn parse_probe_report(text: &str) -> anyhow::Result<ProbeReport> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    let inner = value.get("probe").cloned().unwrap_or(value);
    Ok(serde_json::from_value(inner)?)
}

/// Runs `select` and prints the verdict (a table, or JSON with `--json`).
///
/// # Errors
/// The rule's refusals ([`crate::select::SelectError`]), bad arguments or `--from` files, and JSON
/// encoding failures.
pub fn run(args: &SelectArgs) -> anyhow::Result<()> {
    let verdict = select(&args.select_input()?, args.theta)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&verdict)?);
    } else {
        say_text!("{}", render_verdict(&verdict));
    }
    Ok(())
}

/// A short table of the verdict: one row per endpoint, then the decision and its explanation.
pub fn render_verdict(v: &Verdict) -> String {
    let mut out = String::new();
    let w = v.working_set_bytes;
    // Writing to a String cannot fail.
    let _ = writeln!(
        out,
        "W = {w} B ({:.3} GB, {:.3} GiB), theta = {:.2}%",
        w as f64 / 1e9,
        w as f64 / f64::from(1u32 << 30),
        v.theta * 100.0
    );
    let _ = writeln!(
        out,
        "{:<13} {:>10} {:>12}  status",
        "endpoint", "GB/s", "W/B (s)"
    );
    for arm in &v.arms {
        let num = |x: Option<f64>, digits: usize| {
            x.map_or_else(|| "-".to_owned(), |x| format!("{x:.digits$}"))
        };
        let status = match (&arm.dropped, arm.endpoint == v.chosen) {
            (_, true) => "chosen".to_owned(),
            (Some(reason), false) => format!("dropped: {reason}"),
            (None, false) => "compared".to_owned(),
        };
        let _ = writeln!(
            out,
            "{:<13} {:>10} {:>12}  {status}",
            arm.endpoint.label(),
            num(arm.gbps, 1),
            num(arm.path_seconds, 4)
        );
    }
    let basis = match &v.basis {
        Basis::StorageBound => "storage-bound stop".to_owned(),
        Basis::Fastest => "fastest".to_owned(),
        Basis::TieBand { fastest, gap } => {
            format!("tie band ({fastest} faster by {:.2}%)", gap * 100.0)
        }
    };
    let _ = writeln!(out, "verdict: {} by {basis}", v.chosen);
    let _ = writeln!(out, "{}", v.explanation);
    out
}

/// A byte count that `parse_bytes` refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("`{text}` is not a byte count: expected digits with an optional fraction and unit")]
    NotANumber { text: String },
    #[error("`{text}` has unknown unit `{unit}`: use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB")]
    UnknownUnit { text: String, unit: String },
    #[error("`{text}` is a fraction of a byte; fractions need a unit such as GiB")]
    FractionalBytes { text: String },
    #[error("`{text}` does not fit in 64 bits of bytes")]
    TooLarge { text: String },
}

/// Parses `4683198464`, `119GB`, `4GiB` or `4.36 GiB` (decimal and binary units, case-insensitive;
/// a fractional value with a unit is rounded to the nearest byte).
///
/// # Errors
/// See [`ByteSizeError`].
pub fn parse_bytes(text: &str) -> Result<u64, ByteSizeError> {
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(trimmed.len());
    let (number, unit) = (&trimmed[..split], trimmed[split..].trim());
    let not_a_number = || ByteSizeError::NotANumber {
        text: text.to_owned(),
    };
    let too_large = || ByteSizeError::TooLarge {
        text: text.to_owned(),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.len() + fraction.len() == 0 || !all_digits(whole) || !all_digits(fraction) {
        return Err(not_a_number());
    }
    let multiplier: u128 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        _ => {
            return Err(ByteSizeError::UnknownUnit {
                text: text.to_owned(),
                unit: unit.to_owned(),
            });
        }
    };
    if multiplier == 1 && fraction.bytes().any(|b| b != b'0') {
        return Err(ByteSizeError::FractionalBytes {
            text: text.to_owned(),
        });
    }
    // Exact integer arithmetic: digits * multiplier / 10^fraction_len, rounded half up.
    let digits = format!("{whole}{fraction}");
    let digits: u128 = digits.parse().map_err(|_| too_large())?;
    let scale = u32::try_from(fraction.len())
        .ok()
        .and_then(|n| 10u128.checked_pow(n))
        .ok_or_else(too_large)?;
    let scaled = digits.checked_mul(multiplier).ok_or_else(too_large)?;
    let bytes = scaled.checked_add(scale / 2).ok_or_else(too_large)? / scale;
    u64::try_from(bytes).map_err(|_| too_large())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_byte_counts() {
        let cases = [
            ("4683198464", 4_683_198_464u64),
            ("119GB", 119_000_000_000),
            ("119 gb", 119_000_000_000),
            ("4GiB", 4 * 1024 * 1024 * 1024),
            ("56.7GB", 56_700_000_000),
            ("1.5KiB", 1536),
            // 4.36 * 2^30 = 4681514352.64, rounded to the nearest byte.
            ("4.36GiB", 4_681_514_353),
            ("16TiB", 16 << 40),
            ("7B", 7),
            ("7.0", 7),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_bytes(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_malformed_byte_counts() {
        let text = |t: &str| t.to_owned();
        let cases = [
            (
                "4G",
                ByteSizeError::UnknownUnit {
                    text: text("4G"),
                    unit: text("G"),
                },
            ),
            (
                "16EiB",
                ByteSizeError::UnknownUnit {
                    text: text("16EiB"),
                    unit: text("EiB"),
                },
            ),
            ("GiB", ByteSizeError::NotANumber { text: text("GiB") }),
            (
                "1.2.3GB",
                ByteSizeError::NotANumber {
                    text: text("1.2.3GB"),
                },
            ),
            ("-1", ByteSizeError::NotANumber { text: text("-1") }),
            ("", ByteSizeError::NotANumber { text: text("") }),
            ("1.5", ByteSizeError::FractionalBytes { text: text("1.5") }),
            (
                "20000000TiB",
                ByteSizeError::TooLarge {
                    text: text("20000000TiB"),
                },
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(parse_bytes(input), Err(expected), "{input:?}");
        }
    }

    #[test]
    fn command_line_reaches_the_paper_gh200_verdict() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: SelectArgs,
        }
        let cli = Cli::try_parse_from([
            "select",
            "--map-gbps",
            "350",
            "--resident-gbps",
            "3000",
            "--copy-gbps",
            "355",
            "--working-set",
            "119GB",
            "--resident-capacity",
            "96GB",
        ])
        .unwrap();
        let verdict = select(&cli.args.select_input().unwrap(), cli.args.theta).unwrap();
        assert_eq!(verdict.chosen, burn_mapped::Placement::Map);
        let table = render_verdict(&verdict);
        assert!(
            table.contains("tie band (per-use copy faster by 1.43%)"),
            "{table}"
        );

        let missing = Cli::try_parse_from([
            "select",
            "--map-gbps",
            "1",
            "--copy-gbps",
            "1",
            "--working-set",
            "1GB",
        ])
        .unwrap();
        let err = missing.args.select_input().unwrap_err().to_string();
        assert!(err.contains("--resident-gbps"), "{err}");
        let no_w = Cli::try_parse_from(["select", "--map-gbps", "1"]);
        assert!(no_w.is_err(), "W is required without --from");
    }
}
