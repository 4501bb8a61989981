//! `burn-mapped`: convert checkpoints into mapped stores, inspect and verify them, measure
//! where weights should live, and run Qwen2.5 from adopted pages.

use clap::{Parser, Subcommand};

use burn_mapped_tools::cli;

#[derive(Parser)]
#[command(name = "burn-mapped", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Download a known checkpoint into the cache and print its path.
    Fetch(cli::fetch::FetchArgs),
    /// Convert a safetensors, burnpack or GGUF checkpoint into a store.
    Convert(cli::convert::ConvertArgs),
    /// List a store's tensors, sizes and alignment.
    Inspect(cli::inspect::InspectArgs),
    /// Re-hash every tensor file of a store; non-zero exit on any mismatch.
    Verify(cli::verify::VerifyArgs),
    /// Generate text with Qwen2.5 from a mapped store.
    Generate(cli::generate::GenerateArgs),
    /// Measure the map / resident / per-use-copy endpoints for a store.
    Probe(cli::probe::ProbeArgs),
    /// Apply the endpoint selection rule to given rates.
    Select(cli::select::SelectArgs),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Fetch(args) => cli::fetch::run(&args),
        Command::Convert(args) => cli::convert::run(&args),
        Command::Inspect(args) => cli::inspect::run(&args),
        Command::Verify(args) => cli::verify::run(&args),
        Command::Generate(args) => cli::generate::run(&args),
        Command::Probe(args) => cli::probe::run(&args),
        Command::Select(args) => cli::select::run(&args),
    }
}
