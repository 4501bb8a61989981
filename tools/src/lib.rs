//! Policy and command-line tooling on top of the `burn-mapped` mechanism: which endpoint should serve
//! the weights ([`select`]), how fast each endpoint is on this machine ([`probe`]), the auto
//! placement that probes, caches the probe ([`probe_cache`]) and applies the rule ([`auto`]), and
//! the argument modules of the `burn-mapped` binary ([`cli`]).

// The one way this crate prints text: every line goes through `text::printable`, so nothing
// read from a file (a tensor name, metadata, a path, a generated token) reaches a terminal
// with its control characters live. Defined before the modules so all of them can use it.

/// `println!` through [`text::printable`].
macro_rules! say {
    ($($arg:tt)*) => {
        println!("{}", $crate::text::printable(&format!($($arg)*)))
    };
}

/// `eprintln!` through [`text::printable`].
macro_rules! tell {
    ($($arg:tt)*) => {
        eprintln!("{}", $crate::text::printable(&format!($($arg)*)))
    };
}

/// `print!` through [`text::printable`] (for text that brings its own line ends).
macro_rules! say_text {
    ($($arg:tt)*) => {
        print!("{}", $crate::text::printable(&format!($($arg)*)))
    };
}

pub mod auto;
pub mod cli;
pub mod device;
pub mod fetch;
pub mod interrupt;
pub mod kernel_cache;
pub mod probe;
pub mod probe_cache;
pub mod qwen;
pub mod select;
pub mod text;
