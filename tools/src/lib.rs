//! placeholder

pub mod fetch;
