//! Argument modules of the `burn-mapped` binary; each has an `Args` struct and a `run` function.

pub mod convert;
pub mod inspect;
pub mod verify;

mod progress;
