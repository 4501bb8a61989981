//! Policy and command-line tooling on top of the `burn-mapped` mechanism: which endpoint should serve
//! the weights ([`select`]), how fast each endpoint is on this machine ([`probe`]), the auto
//! placement that probes, caches the probe ([`probe_cache`]) and applies the rule ([`auto`]), and
//! the argument modules of the `burn-mapped` binary ([`cli`]).

pub mod auto;
pub mod cli;
pub mod device;
pub mod fetch;
pub mod probe;
pub mod probe_cache;
pub mod qwen;
pub mod select;
