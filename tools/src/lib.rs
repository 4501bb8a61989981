//! Policy on top of the `burn-mapped` mechanism: which endpoint should serve the weights ([`select`])
//! and how fast each endpoint is on this machine ([`probe`]).

pub mod probe;
pub mod select;
