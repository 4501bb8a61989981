//! Ctrl-C during a generation ends it cleanly: the first `SIGINT` only asks the loop to stop
//! after the token in hand, so the command still prints what it generated and its summary; a
//! second one ends the process as usual.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    // SAFETY: signal(2) is async-signal-safe; the default disposition ends the process at a
    // second Ctrl-C.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
    }
}

/// Catches the next `SIGINT` (see the module documentation).
pub fn catch() {
    INTERRUPTED.store(false, Ordering::SeqCst);
    // SAFETY: installs a handler that only stores to an atomic and calls signal(2), both
    // async-signal-safe.
    unsafe {
        libc::signal(
            libc::SIGINT,
            on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t,
        );
    }
}

/// Whether a `SIGINT` arrived since [`catch`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
