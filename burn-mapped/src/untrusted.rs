//! Opening and reading files whose names come from untrusted places (a manifest, an index, a
//! cache entry, a path recorded in a store).
//!
//! Three hazards are closed here once, for every caller:
//! - a FIFO or a device opened for reading blocks or never ends: files are opened with
//!   `O_NONBLOCK` and must then be regular files, checked on the open descriptor;
//! - a link where none is expected redirects the read: [`Links::Refuse`] opens with
//!   `O_NOFOLLOW`;
//! - a size checked on the reported length and then read unbounded (a link to `/dev/zero`, a
//!   file growing under the reader): [`read_capped`] caps the bytes actually read.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether a final symbolic link in the path is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow it (a path the user typed may be a link).
    Follow,
    /// Refuse it (`ELOOP`): a name read from a file never names a link.
    Refuse,
}

/// Opens `path` read-only without blocking, and checks that it is a regular file.
///
/// # Errors
/// The open's own error, or [`io::ErrorKind::InvalidInput`] for anything but a regular file
/// (a FIFO, socket, device or directory).
pub fn open_regular(path: &Path, links: Links) -> io::Result<File> {
    let name = c_path(path.as_os_str().as_bytes())?;
    // SAFETY: `name` is NUL-terminated and lives for the call.
    let fd = unsafe { libc::open(name.as_ptr(), flags(links)) };
    regular_from_fd(fd, links)
}

/// [`open_regular`] for `name` inside the open directory `dir`, never following a link.
///
/// # Errors
/// As [`open_regular`].
pub fn open_regular_at(dir: &File, name: &str) -> io::Result<File> {
    let name = c_path(name.as_bytes())?;
    // SAFETY: `dir` is an open descriptor for the call's duration and `name` is NUL-terminated.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags(Links::Refuse)) };
    regular_from_fd(fd, Links::Refuse)
}

/// Reads all of `file`, failing with [`io::ErrorKind::FileTooLarge`] once more than `cap`
/// bytes arrive, whatever the file claimed its size was.
///
/// # Errors
/// Read errors, or [`io::ErrorKind::FileTooLarge`].
pub fn read_capped(file: File, cap: u64) -> io::Result<Vec<u8>> {
    let hint = file.metadata().map_or(0, |m| m.len().min(cap));
    let mut bytes = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    file.take(cap.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > cap {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("more than {cap} bytes"),
        ));
    }
    Ok(bytes)
}

/// Opens `path` with [`open_regular`] and reads it with [`read_capped`].
///
/// # Errors
/// As those two.
pub fn read_regular(path: &Path, links: Links, cap: u64) -> io::Result<Vec<u8>> {
    read_capped(open_regular(path, links)?, cap)
}

fn flags(links: Links) -> libc::c_int {
    let base = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
    match links {
        Links::Follow => base,
        Links::Refuse => base | libc::O_NOFOLLOW,
    }
}

fn c_path(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains NUL"))
}

/// Takes ownership of `fd` (negative: the OS error), checks it is a regular file and clears
/// `O_NONBLOCK`, which only served the open.
fn regular_from_fd(fd: libc::c_int, links: Links) -> io::Result<File> {
    if fd < 0 {
        let error = io::Error::last_os_error();
        // With O_NOFOLLOW, ELOOP means the name is a link, not a loop of links.
        if links == Links::Refuse && error.raw_os_error() == Some(libc::ELOOP) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a symbolic link, which is never followed here (names read from a file must \
                 name the file itself)",
            ));
        }
        return Err(error);
    }
    // SAFETY: `fd` was just returned by open/openat and nothing else owns it.
    let file = unsafe { File::from_raw_fd(fd) };
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, socket, device or directory)",
        ));
    }
    // SAFETY: fcntl on a descriptor `file` owns; F_GETFL/F_SETFL change no memory.
    unsafe {
        let fl = libc::fcntl(file.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(file.as_raw_fd(), libc::F_SETFL, fl & !libc::O_NONBLOCK);
        }
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Unit tests: the FIFO case needs a FIFO, which only these low-level helpers see directly.
    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let name = c_path(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: `name` is a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let err = open_regular(&fifo, Links::Follow).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn reading_stops_at_the_cap_whatever_the_reported_size() {
        let err = read_regular(Path::new("/dev/zero"), Links::Follow, 1024);
        // /dev/zero is a character device: refused before any read.
        assert_eq!(err.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, vec![1u8; 2048]).unwrap();
        let err = read_regular(&path, Links::Follow, 1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(
            read_regular(&path, Links::Follow, 2048).unwrap().len(),
            2048
        );
    }

    #[test]
    fn a_link_is_refused_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(open_regular(&link, Links::Follow).is_ok());
        assert!(open_regular(&link, Links::Refuse).is_err());
    }
}
