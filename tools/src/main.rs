//! `burn-mapped`: convert checkpoints into mapped stores, inspect and verify them, measure
//! where weights should live, and run Qwen2.5 from adopted pages.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use burn_mapped_tools::cli;
use burn_mapped_tools::text::printable;

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

fn main() -> ExitCode {
    let command = Cli::parse().command;
    // A bad thread count or CPU tier is a usage error, refused before any work (as clap
    // refuses flags).
    let usage = burn_mapped::host::threads_from_env()
        .err()
        .map(|e| e.to_string())
        .or_else(|| {
            burn_mapped::host::cpu_tier_from_env()
                .err()
                .map(|e| e.to_string())
        });
    if let Some(e) = usage {
        eprintln!("error: {}", printable(&e));
        return ExitCode::from(2);
    }
    let result = match command {
        Command::Fetch(args) => cli::fetch::run(&args),
        Command::Convert(args) => cli::convert::run(&args),
        Command::Inspect(args) => cli::inspect::run(&args),
        Command::Verify(args) => cli::verify::run(&args),
        Command::Generate(args) => cli::generate::run(&args),
        Command::Probe(args) => cli::probe::run(&args),
        Command::Select(args) => cli::select::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Errors name files, tensors and metadata: printed through the same filter.
            eprintln!("Error: {}", printable(&format!("{e:?}")));
            ExitCode::FAILURE
        }
    }
}
