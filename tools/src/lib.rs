//! Policy on top of the `burn-mapped` mechanism: which endpoint should serve the weights ([`select`]).

pub mod select;
