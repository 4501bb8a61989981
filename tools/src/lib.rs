//! Policy and command-line tooling on top of the `burn-mapped` mechanism: the argument modules
//! of the `burn-mapped` binary ([`cli`]).

pub mod cli;
