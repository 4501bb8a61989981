//! Argument modules of the `burn-mapped` binary; each has an `Args` struct and a `run` function.

pub mod convert;
pub mod fetch;
pub mod generate;
pub mod inspect;
pub mod placement_args;
pub mod probe;
pub mod select;
pub mod verify;

mod progress;
