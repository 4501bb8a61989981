//! A clear end for a mapped file that shrinks under the program.
//!
//! Touching a mapped page past the end of its file raises `SIGBUS`, which by default kills the
//! process with no word about which file. Every mapping this crate makes (store files, and the
//! checkpoints it converts or adopts in place) registers its address range and file path here;
//! a `SIGBUS` handler, installed with the first registration, looks the faulting address up
//! and, if it lies in a registered range, writes one line naming the file to stderr, removes
//! the temporary directories of the stores being written ([`remove_on_fault`]), and exits with
//! [`SIGBUS_EXIT_CODE`]. A fault anywhere else goes to the handler that was there before (a
//! program that installs its own handler later replaces this one).
//!
//! The handler is async-signal-safe: it reads fixed tables of atomics and calls only
//! `write(2)`, `open(2)`, `getdents64(2)`, `unlinkat(2)`, `close(2)`, `rmdir(2)` and
//! `_exit(2)`. The table holds [`SLOTS`] mappings; mappings past that are not reported (they
//! still fault as before).

use std::path::Path;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU8, AtomicUsize, Ordering};

/// Exit code of a process ended by a fault in a mapped file: 1, the CLI's code for a bad input
/// named in its message (a file changed under the process is one), so a script sees the same
/// code for every input at fault.
pub const SIGBUS_EXIT_CODE: i32 = 1;

/// Mappings the table can name at once (a store maps one file per tensor, a few hundred for a
/// typical LLM).
const SLOTS: usize = 4096;

/// What a registered mapping holds, for the handler's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A store's tensor file.
    Store = 0,
    /// A checkpoint read in place or converted (GGUF, safetensors, burnpack).
    Source = 1,
}

struct Slot {
    state: AtomicU8,
    role: AtomicU8,
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
    role: AtomicU8::new(Role::Store as u8),
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    path: AtomicPtr::new(std::ptr::null_mut()),
    path_len: AtomicUsize::new(0),
};

static TABLE: [Slot; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
static mut PREVIOUS: std::mem::MaybeUninit<libc::sigaction> = std::mem::MaybeUninit::zeroed();

/// The slot a registration claimed in its table (`None`: it could not, or had no need to) and
/// the path bytes the slot points at, which it owns.
struct Claim {
    slot: Option<usize>,
    _path: Box<[u8]>,
}

impl std::fmt::Debug for Claim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Claim").field("slot", &self.slot).finish()
    }
}

/// A registered range; unregisters when dropped (before its mapping is unmapped).
#[derive(Debug)]
pub(crate) struct Registration(Claim);

/// Claims the first free slot of a table, given each slot's state: its index, or `None` when
/// every slot is taken.
fn claim<'a>(states: impl IntoIterator<Item = &'a AtomicU8>) -> Option<usize> {
    states.into_iter().position(|state| {
        state
            .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    })
}

/// Registers `range` as the mapping of the store file `path`.
pub(crate) fn register(range: std::ops::Range<usize>, path: &Path) -> Registration {
    register_as(range, path, Role::Store)
}

/// Registers `range` as the mapping of `path`, which holds `role`.
pub(crate) fn register_as(range: std::ops::Range<usize>, path: &Path, role: Role) -> Registration {
    use std::os::unix::ffi::OsStrExt;
    INSTALL.call_once(install);
    let mut bytes: Box<[u8]> = path.as_os_str().as_bytes().into();
    if range.is_empty() {
        return Registration(Claim {
            slot: None,
            _path: bytes,
        });
    }
    let slot = claim(TABLE.iter().map(|s| &s.state));
    if let Some(i) = slot {
        let s = &TABLE[i];
        s.path.store(bytes.as_mut_ptr(), Ordering::Relaxed);
        s.path_len.store(bytes.len(), Ordering::Relaxed);
        s.role.store(role as u8, Ordering::Relaxed);
        s.end.store(range.end, Ordering::Relaxed);
        // Publishes the fields above to the handler.
        s.start.store(range.start, Ordering::Release);
    }
    Registration(Claim { slot, _path: bytes })
}

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.0.slot {
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
        // One thread reports and cleans; any other that faults meanwhile waits for its exit.
        if REPORTING.swap(true, Ordering::AcqRel) {
            loop {
                // SAFETY: pause is async-signal-safe; the reporting thread ends the process.
                unsafe { libc::pause() };
            }
        }
        let path = s.path.load(Ordering::Relaxed);
        let len = s.path_len.load(Ordering::Relaxed);
        write_err(if s.role.load(Ordering::Relaxed) == Role::Source as u8 {
            b"burn-mapped: mapped input file "
        } else {
            b"burn-mapped: mapped store file "
        });
        if !path.is_null() {
            // SAFETY: the registration owning these bytes outlives its slot's publication.
            write_err(escape_line(unsafe {
                std::slice::from_raw_parts(path, len)
            }));
        }
        write_err(
            b" became unreadable while mapped (truncated by another program, or an I/O error); exiting\n",
        );
        remove_registered_dirs();
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

/// `bytes`, or a fixed placeholder when they hold a control byte that could drive a terminal
/// (the handler cannot allocate to escape them).
fn escape_line(bytes: &[u8]) -> &[u8] {
    if bytes.iter().any(|&b| b < 0x20 || b == 0x7f) {
        b"(a path with control characters)"
    } else {
        bytes
    }
}

fn write_err(bytes: &[u8]) {
    // SAFETY: writes `bytes` to stderr; write(2) is async-signal-safe. Short writes are
    // accepted: the process is about to exit.
    unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
}

/// Set by the first thread that reports a fault.
static REPORTING: AtomicBool = AtomicBool::new(false);

/// Temporary store directories the handler removes before exiting.
const DIR_SLOTS: usize = 64;

struct DirSlot {
    state: AtomicU8,
    /// NUL-terminated path, or null.
    path: AtomicPtr<u8>,
    /// Which entries of the directory its owner wrote (and the handler removes): a
    /// `fn(&[u8]) -> bool` as a pointer, set before `path` is published.
    written: AtomicPtr<()>,
}

#[allow(clippy::declare_interior_mutable_const)] // the array initializer, each slot its own
const EMPTY_DIR: DirSlot = DirSlot {
    state: AtomicU8::new(FREE),
    path: AtomicPtr::new(std::ptr::null_mut()),
    written: AtomicPtr::new(std::ptr::null_mut()),
};

static DIRS: [DirSlot; DIR_SLOTS] = [EMPTY_DIR; DIR_SLOTS];

/// A temporary directory registered with [`remove_on_fault`]; unregisters when dropped.
#[derive(Debug)]
pub(crate) struct DirRegistration(Claim);

/// Asks the handler to remove the temporary directory `dir` (the entries `written` accepts,
/// then the directory itself if that empties it) if a registered mapping faults
/// while it is registered: a conversion whose input is truncated under it leaves nothing
/// behind. Installs the handler, so a fault in a mapping registered later is reported too.
pub(crate) fn remove_on_fault(dir: &Path, written: fn(&[u8]) -> bool) -> DirRegistration {
    use std::os::unix::ffi::OsStrExt;
    INSTALL.call_once(install);
    let mut bytes: Vec<u8> = dir.as_os_str().as_bytes().to_vec();
    bytes.push(0);
    let mut bytes = bytes.into_boxed_slice();
    if bytes[..bytes.len() - 1].contains(&0) {
        return DirRegistration(Claim {
            slot: None,
            _path: bytes,
        });
    }
    let slot = claim(DIRS.iter().map(|s| &s.state));
    if let Some(i) = slot {
        DIRS[i].written.store(written as *mut (), Ordering::Release);
        DIRS[i].path.store(bytes.as_mut_ptr(), Ordering::Release);
    }
    DirRegistration(Claim { slot, _path: bytes })
}

impl Drop for DirRegistration {
    fn drop(&mut self) {
        if let Some(i) = self.0.slot {
            DIRS[i].path.store(std::ptr::null_mut(), Ordering::Release);
            DIRS[i].state.store(FREE, Ordering::Release);
        }
    }
}

/// Removes every registered temporary directory's writer files, then the directory.
fn remove_registered_dirs() {
    for slot in &DIRS {
        let path = slot.path.load(Ordering::Acquire);
        if !path.is_null() {
            let written = slot.written.load(Ordering::Acquire);
            // SAFETY: `written` was stored from a `fn(&[u8]) -> bool` before `path` was
            // published (release/acquire), and function pointers and data pointers have the
            // same size on the platforms this crate builds for (Unix).
            let written: fn(&[u8]) -> bool = unsafe { std::mem::transmute(written) };
            // SAFETY: the registration owning this NUL-terminated path outlives its
            // publication in the slot.
            unsafe { remove_dir_raw(path.cast(), written) };
        }
    }
}

/// Buffer for directory entries; used by the one reporting thread only.
static mut DIRENTS: [u8; 4096] = [0; 4096];

/// Unlinks the entries `written` accepts in the directory at `path`, then removes it, with system calls
/// only.
///
/// # Safety
/// `path` is a valid NUL-terminated string; only the thread that set [`REPORTING`] calls this.
unsafe fn remove_dir_raw(path: *const libc::c_char, written: fn(&[u8]) -> bool) {
    // SAFETY (whole body): plain system calls on a descriptor this function owns, reading
    // `DIRENTS`, which only the reporting thread touches; each record's fields are read
    // within the length the kernel returned.
    unsafe {
        let fd = libc::open(
            path,
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return;
        }
        let buf = &raw mut DIRENTS;
        // Twice: removing entries while listing may skip some on some file systems.
        for _ in 0..2 {
            libc::lseek(fd, 0, libc::SEEK_SET);
            loop {
                let n = libc::syscall(libc::SYS_getdents64, fd, buf.cast::<u8>(), 4096usize);
                if n <= 0 {
                    break;
                }
                let base = buf.cast::<u8>();
                let mut at = 0usize;
                while at + 19 < n as usize {
                    // linux_dirent64: u64 ino, i64 off, u16 reclen, u8 type, name.
                    let reclen =
                        u16::from_ne_bytes([*base.add(at + 16), *base.add(at + 17)]) as usize;
                    if reclen == 0 || at + reclen > n as usize {
                        break;
                    }
                    let name = base.add(at + 19);
                    let mut len = 0;
                    while 19 + len < reclen && *name.add(len) != 0 {
                        len += 1;
                    }
                    if written(std::slice::from_raw_parts(name, len)) {
                        libc::unlinkat(fd, name.cast(), 0);
                    }
                    at += reclen;
                }
            }
        }
        libc::close(fd);
        libc::rmdir(path);
    }
}
