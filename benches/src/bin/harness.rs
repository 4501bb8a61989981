//! The load-path benchmark harness: the Qwen2.5 checkpoint (its f32 and q8 stores) and a synthetic
//! >= 4 GiB stack of linear layers, loaded five ways, each measurement in a fresh process.
//!
//! ```text
//! cargo run --release -p burn-mapped-benches --bin harness -- run            # everything, ~20 min
//! cargo run --release -p burn-mapped-benches --bin harness -- run --rounds 3 --cold-rounds 1 \
//!     --share 1,4 --synthetic-layers 16 --synthetic-rounds 3                  # quicker
//! cargo run --release -p burn-mapped-benches --bin harness -- doc            # docs/PERFORMANCE.md from JSON
//! ```

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use burn_mapped_benches::child::{self, ChildSpec};
use burn_mapped_benches::markdown::markdown;
use burn_mapped_benches::parent::{self, RunConfig};
use burn_mapped_benches::qwen::QwenModel;
use burn_mapped_benches::report::{Report, Settings};
use burn_mapped_benches::targets::targets;
use clap::{Parser, Subcommand};

const DEFAULT_PROMPT: &str = "Write a Python function that checks whether a number is prime.";

#[derive(Parser)]
#[command(about = "Load-path benchmarks: mapped store vs Burn's loaders")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the benchmarks, write results/NAME.json, the SVGs and the section of
    /// docs/PERFORMANCE.md.
    Run(RunArgs),
    /// Regenerate the section of docs/PERFORMANCE.md (and the SVGs) from a results file.
    Doc {
        /// Results file (default: results/cpu.json in this crate).
        #[arg(long)]
        json: Option<PathBuf>,
        /// Page to update (default: the workspace's docs/PERFORMANCE.md).
        #[arg(long)]
        doc: Option<PathBuf>,
    },
    /// Measure (again) only the llama.cpp reference and store it in a results file.
    Llama {
        #[arg(long)]
        json: Option<PathBuf>,
        /// Page to update afterwards (default: the workspace's docs/PERFORMANCE.md).
        #[arg(long)]
        doc: Option<PathBuf>,
    },
    /// Print the Markdown tables of a results file.
    Table {
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Internal: one measurement in a fresh process.
    #[command(hide = true)]
    Child { spec: String },
}

#[derive(clap::Args)]
struct RunArgs {
    /// Name of the results (results/NAME.json, results/NAME-*.svg).
    #[arg(long, default_value = "cpu")]
    name: String,
    /// Warm rounds of the Qwen arms (each round runs every arm once, order rotated).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Cold rounds of the Qwen arms (files evicted before each child; no decode).
    #[arg(long, default_value_t = 3)]
    cold_rounds: usize,
    /// Greedy tokens decoded after the first one.
    #[arg(long, default_value_t = 64)]
    decode_tokens: usize,
    /// Process counts of the sharing experiment.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 2, 4])]
    share: Vec<usize>,
    /// Tokens each sharing process decodes before it is measured.
    #[arg(long, default_value_t = 8)]
    share_tokens: usize,
    /// Layers of the synthetic model (0 skips it).
    #[arg(long, default_value_t = 64)]
    synthetic_layers: usize,
    /// Width of each synthetic layer ([dim, dim] f32; 64 x 4096 is 4 GiB).
    #[arg(long, default_value_t = 4096)]
    synthetic_dim: usize,
    /// Rounds of the synthetic arms.
    #[arg(long, default_value_t = 5)]
    synthetic_rounds: usize,
    /// Skip the eviction experiment.
    #[arg(long)]
    no_evict: bool,
    /// Skip the llama.cpp reference.
    #[arg(long)]
    no_llama_cpp: bool,
    /// Skip the Qwen model (synthetic only).
    #[arg(long)]
    no_qwen: bool,
    /// The Qwen stores to measure: f32, and q8 (projections int8 with f16 row scales).
    #[arg(long, value_delimiter = ',', default_values_t = QwenModel::ALL.to_vec())]
    models: Vec<QwenModel>,
    /// The fixed prompt.
    #[arg(long, default_value = DEFAULT_PROMPT)]
    prompt: String,
    /// Send the prompt without the chat template.
    #[arg(long)]
    raw: bool,
    /// Cache for the checkpoint, its store and the benchmark inputs.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Where results go.
    #[arg(long)]
    results_dir: Option<PathBuf>,
    /// Leave docs/PERFORMANCE.md alone.
    #[arg(long)]
    no_doc: bool,
}

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn default_json() -> PathBuf {
    crate_dir().join("results").join("cpu.json")
}

fn default_doc() -> PathBuf {
    crate_dir().join("..").join("docs").join("PERFORMANCE.md")
}

fn read_report(path: &Path) -> Result<Report> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// Writes `rep` back over `json`, with its figures beside it, and regenerates `doc`'s section.
fn rewrite(rep: &Report, json: &Path, doc: Option<PathBuf>) -> Result<()> {
    let dir = json.parent().unwrap_or(Path::new("."));
    let doc = doc.unwrap_or_else(default_doc);
    parent::write_outputs(rep, dir, Some(doc.as_path()))
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Child { spec } => {
            let spec: ChildSpec = serde_json::from_str(&spec).context("child spec")?;
            child::run(&spec)
        }
        Cmd::Table { json } => {
            let rep = read_report(&json.unwrap_or_else(default_json))?;
            println!("{}", markdown(&rep, None));
            Ok(())
        }
        Cmd::Llama { json, doc } => {
            let json = json.unwrap_or_else(default_json);
            let mut rep = read_report(&json)?;
            let q = rep.qwen.as_ref().context("the results hold no Qwen run")?;
            let paths = burn_mapped_tools::qwen::resolve(
                &q.store,
                Some(burn_mapped::convert::WeightFormat::Float(
                    burn_mapped::convert::CastTo::F32,
                )),
                &burn_mapped_tools::fetch::default_cache_dir(),
                None,
            )?;
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
            let l = burn_mapped_benches::llama::measure(
                &paths.gguf,
                &q.prompt_ids,
                rep.settings.decode_tokens,
                threads,
            )?;
            eprintln!("llama.cpp: {} {:.2} tok/s", l.status, l.decode_tok_s);
            rep.llama_cpp = Some(l);
            rep.notes.push(
                "the llama.cpp reference was measured separately with `harness llama`".into(),
            );
            rewrite(&rep, &json, doc)
        }
        Cmd::Doc { json, doc } => {
            let json = json.unwrap_or_else(default_json);
            let mut rep = read_report(&json)?;
            // Targets are derived from the samples: recompute them, so a corrected definition
            // shows without measuring again.
            rep.targets = targets(&rep);
            rewrite(&rep, &json, doc)
        }
        Cmd::Run(a) => {
            let command = format!(
                "cargo run --release -p burn-mapped-benches --bin harness -- {}",
                std::env::args().skip(1).collect::<Vec<_>>().join(" ")
            );
            let cfg = RunConfig {
                name: a.name,
                settings: Settings {
                    rounds: a.rounds,
                    cold_rounds: a.cold_rounds,
                    decode_tokens: a.decode_tokens,
                    share: a.share,
                    share_tokens: a.share_tokens,
                    synthetic_layers: a.synthetic_layers,
                    synthetic_dim: a.synthetic_dim,
                    synthetic_rounds: a.synthetic_rounds,
                    prompt: a.prompt,
                    chat: !a.raw,
                },
                evict: !a.no_evict,
                llama_cpp: !a.no_llama_cpp,
                qwen: !a.no_qwen && !a.models.is_empty(),
                models: a.models,
                cache_dir: a
                    .cache_dir
                    .unwrap_or_else(burn_mapped_tools::fetch::default_cache_dir),
                results_dir: a.results_dir.unwrap_or_else(|| crate_dir().join("results")),
                doc: (!a.no_doc).then(default_doc),
                command,
            };
            let rep = parent::run(&cfg)?;
            println!("{}", markdown(&rep, None));
            if !rep.identity.all_ok() {
                for m in &rep.identity.mismatches {
                    eprintln!("IDENTITY MISMATCH: {m}");
                }
                anyhow::bail!(
                    "arms disagree ({} mismatches); see above",
                    rep.identity.mismatches.len()
                );
            }
            Ok(())
        }
    }
}
