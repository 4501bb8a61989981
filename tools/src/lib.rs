//! Policy and command-line tooling on top of the `burn-mapped` mechanism: which endpoint should serve
//! the weights ([`select`]), how fast each endpoint is on this machine ([`probe`]), and the argument
//! modules of the `burn-mapped` binary ([`cli`]).

pub mod cli;
pub mod device;
pub mod fetch;
pub mod placement;
pub mod probe;
pub mod qwen;
pub mod select;
