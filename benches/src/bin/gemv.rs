//! GEMV benchmark under the paper's matched protocol (§3.1), on Burn's own stream: see
//! [`burn_mapped_benches::gemv`], or `gemv --help` for the protocol, the arms and the flags.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    burn_mapped_benches::gemv::run(burn_mapped_benches::gemv::Args::parse())
}
