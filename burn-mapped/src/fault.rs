//! A clear end for a mapped file that shrinks under the program.
//!
//! Touching a mapped page past the end of its file raises `SIGBUS`, which by default kills the
//! process with no word about which file. Every mapping this crate makes registers its address
//! range and file path here; a `SIGBUS` handler, installed with the first registration, looks
//! the faulting address up and, if it lies in a registered range, writes one line naming the
//! file to stderr and exits with [`SIGBUS_EXIT_CODE`]. A fault anywhere else goes to the handler that was there before (a
//! program that installs its own handler later replaces this one).
//!
//! The handler is async-signal-safe: it reads a fixed table of atomics and calls only
//! `write(2)` and `_exit(2)`. The table holds [`SLOTS`] mappings; mappings past that are not
//! reported (they still fault as before).

use std::path::Path;
use std::sync::Once;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// Exit code of a process ended by a fault in a mapped store file (`EX_IOERR` of
/// `sysexits.h`: an I/O error on a file).
pub const SIGBUS_EXIT_CODE: i32 = 74;

/// Mappings the table can name at once (a store maps one file per tensor, a few hundred for a
/// typical LLM).
const SLOTS: usize = 4096;

struct Slot {
    state: AtomicU8,
    start: AtomicUsize,
    end: AtomicUsize,
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
}

const FREE: u8 = 0;
const CLAIMED: u8 = 1;

#[allow(clippy::declare_interior_mutable_const)] // the array initializer, each slot its own
const EMPTY: Slot = Slot {
    state: AtomicU8::new(FREE),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    path: AtomicPtr::new(std::ptr::null_mut()),
    path_len: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();

/// A registered range; unregisters when dropped (before its mapping is unmapped).
pub(crate) struct Registration {
    slot: Option<usize>,
    // Owns the bytes the table points at.
    _path: Box<[u8]>,
}

impl std::fmt::Debug for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registration")
            .field("slot", &self.slot)
            .finish()
    }
}

/// Registers `range` as the mapping of `path`.
pub(crate) fn register(range: std::ops::Range<usize>, path: &Path) -> Registration {
    use std::os::unix::ffi::OsStrExt;
    INSTALL.call_once(install);
    let mut bytes: Box<[u8]> = path.as_os_str().as_bytes().into();
    if range.is_empty() {
        return Registration {
            slot: None,
            _path: bytes,
        };
    }
    let slot = TABLE.iter().position(|s| {
        s.state
            .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    });
    if let Some(i) = slot {
        let s = &TABLE[i];
        s.path.store(bytes.as_mut_ptr(), Ordering::Relaxed);
        s.path_len.store(bytes.len(), Ordering::Relaxed);
        s.end.store(range.end, Ordering::Relaxed);
        // Publishes the fields above to the handler.
        s.start.store(range.start, Ordering::Release);
    }
    Registration { slot, _path: bytes }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            let s = &TABLE[i];
            s.start.store(0, Ordering::Release);
            s.path.store(std::ptr::null_mut(), Ordering::Relaxed);
            s.path_len.store(0, Ordering::Relaxed);
            s.state.store(FREE, Ordering::Release);
        }
    }
}

fn install() {
    // SAFETY: sigaction with a zeroed struct, a valid handler and an empty mask; the previous
    // disposition is written into PREVIOUS once, before the handler can run.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        let previous = &raw mut PREVIOUS;
        libc::sigaction(libc::SIGBUS, &action, (*previous).as_mut_ptr());
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for s in &TABLE {
        let start = s.start.load(Ordering::Acquire);
        if start == 0 || addr < start || addr >= s.end.load(Ordering::Relaxed) {
            continue;
        }
        let path = s.path.load(Ordering::Relaxed);
        let len = s.path_len.load(Ordering::Relaxed);
        write_err(b"burn-mapped: mapped store file ");
        if !path.is_null() {
            // SAFETY: the registration owning these bytes outlives its slot's publication.
            write_err(unsafe { std::slice::from_raw_parts(path, len) });
        }
        write_err(
            b" became unreadable while mapped (truncated by another program, or an I/O error); exiting\n",
        );
        // SAFETY: _exit is async-signal-safe and ends the process at once.
        unsafe { libc::_exit(SIGBUS_EXIT_CODE) };
    }
    // Not ours: hand the fault to what was there before (Rust's runtime installs its own
    // handler, for stack overflows), as if this handler were not there.
    // SAFETY: PREVIOUS was filled by `install` before this handler was set. A previous
    // SA_SIGINFO handler is called with the arguments the kernel gave; otherwise the previous
    // disposition is restored (sigaction is async-signal-safe) and the faulting access, which
    // repeats on return, meets it.
    unsafe {
        let previous = &*(&raw const PREVIOUS).cast::<libc::sigaction>();
        let handler = previous.sa_sigaction;
        if previous.sa_flags & libc::SA_SIGINFO != 0
            && handler != libc::SIG_DFL
            && handler != libc::SIG_IGN
        {
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                std::mem::transmute(handler);
            f(sig, info, context);
        } else {
            libc::sigaction(libc::SIGBUS, previous, std::ptr::null_mut());
        }
    }
}

fn write_err(bytes: &[u8]) {
    // SAFETY: writes `bytes` to stderr; write(2) is async-signal-safe. Short writes are
    // accepted: the process is about to exit.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}
