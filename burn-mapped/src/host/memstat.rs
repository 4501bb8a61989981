//! Linux memory accounting used to prove adoption: resident set split into anonymous and
//! file-backed pages, which mapping a given file occupies, and how much of it is in the page
//! cache. Reads `/proc`; every function returns an `io::Error` elsewhere.

use std::io;
use std::path::Path;

/// Resident set sizes of a process, in bytes (`/proc/PID/status`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Rss {
    /// Anonymous pages: heap, private copies. Weights copied by a loader land here.
    pub anon: u64,
    /// File-backed pages mapped by the process (adopted weights land here).
    pub file: u64,
    /// Shared memory (tmpfs, shm).
    pub shmem: u64,
    /// Peak resident set (`VmHWM`).
    pub peak: u64,
}

/// Reads this process's [`Rss`].
pub fn rss_self() -> io::Result<Rss> {
    rss_of("self")
}

/// Reads the [`Rss`] of process `pid` (`"self"` for this one).
pub fn rss_of(pid: &str) -> io::Result<Rss> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mut rss = Rss::default();
    for line in status.lines() {
        let field = |prefix: &str| line.strip_prefix(prefix).and_then(kb).map(|kb| kb * 1024);
        if let Some(v) = field("RssAnon:") {
            rss.anon = v;
        } else if let Some(v) = field("RssFile:") {
            rss.file = v;
        } else if let Some(v) = field("RssShmem:") {
            rss.shmem = v;
        } else if let Some(v) = field("VmHWM:") {
            rss.peak = v;
        }
    }
    Ok(rss)
}

/// The number of a `/proc` field's value in `kB` (`"   1234 kB"`, the text after its name).
fn kb(value: &str) -> Option<u64> {
    value.trim().trim_end_matches("kB").trim().parse().ok()
}

/// The machine's physical memory in bytes (`MemTotal` of `/proc/meminfo`): what no single
/// allocation can exceed, so a size above it is refused before it is attempted.
pub fn physical_memory() -> io::Result<u64> {
    meminfo("MemTotal:")
}

/// The bytes of `/proc/meminfo`'s field `name` (with its colon).
fn meminfo(name: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    let kb = text
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(kb)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("no {name} in /proc/meminfo"),
            )
        })?;
    Ok(kb.saturating_mul(1024))
}

/// Memory the kernel estimates it can give without swapping, in bytes (`MemAvailable` of
/// `/proc/meminfo`: free memory plus the page cache and slabs it can reclaim).
pub fn available_memory() -> io::Result<u64> {
    meminfo("MemAvailable:")
}

/// Proportional set size and anonymous bytes of process `pid` (`/proc/PID/smaps_rollup`).
pub fn pss_of(pid: &str) -> io::Result<(u64, u64)> {
    let text = smaps_rollup(pid)?;
    Ok((
        rollup_bytes(&text, "Pss:"),
        rollup_bytes(&text, "Anonymous:"),
    ))
}

/// Bytes of file pages process `pid` maps with huge (PMD) entries (`FilePmdMapped` in
/// `/proc/PID/smaps_rollup`): how much of a mapped store the TLB covers 2 MiB at a time.
pub fn file_pmd_mapped(pid: &str) -> io::Result<u64> {
    Ok(rollup_bytes(&smaps_rollup(pid)?, "FilePmdMapped:"))
}

fn smaps_rollup(pid: &str) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
}

/// The `kB` field `name` of an smaps_rollup text, in bytes (0 when absent).
fn rollup_bytes(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(kb)
        .unwrap_or(0)
        * 1024
}

/// One mapping of a file in a process, from `/proc/PID/smaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMapping {
    /// Virtual address range.
    pub range: std::ops::Range<usize>,
    /// Permission string (`r--s` for a read-only shared mapping).
    pub perms: String,
    /// Bytes of the mapping resident and shared with another process, unmodified.
    pub shared_clean: u64,
    /// Bytes resident and private, unmodified.
    pub private_clean: u64,
    /// Bytes resident and modified (would be written back or are anonymous copies).
    pub dirty: u64,
    /// Bytes mapped with huge (PMD) entries.
    pub file_pmd_mapped: u64,
}

/// Every mapping of `path` in process `pid`.
pub fn file_mappings(pid: &str, path: &Path) -> io::Result<Vec<FileMapping>> {
    let path = std::fs::canonicalize(path)?;
    let path = path.to_string_lossy();
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    let mut out = Vec::new();
    let mut current: Option<FileMapping> = None;
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let first = parts.next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            out.extend(current.take());
            let perms = parts.next().unwrap_or("").to_string();
            let name = line.split_whitespace().nth(5).unwrap_or("");
            if name == path {
                current = Some(FileMapping {
                    range: lo..hi,
                    perms,
                    shared_clean: 0,
                    private_clean: 0,
                    dirty: 0,
                    file_pmd_mapped: 0,
                });
            }
            continue;
        }
        if let Some(m) = current.as_mut() {
            let kb = || {
                line.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    * 1024
            };
            match first {
                "Shared_Clean:" => m.shared_clean = kb(),
                "Private_Clean:" => m.private_clean = kb(),
                "Shared_Dirty:" | "Private_Dirty:" => m.dirty += kb(),
                "FilePmdMapped:" => m.file_pmd_mapped = kb(),
                _ => {}
            }
        }
    }
    out.extend(current);
    Ok(out)
}

/// Fraction of the pages of `bytes` (a mapping) resident in memory, via `mincore`.
pub fn residency(bytes: &[u8]) -> io::Result<f64> {
    if bytes.is_empty() {
        return Ok(1.0);
    }
    let page = crate::layout::page_size();
    let start = bytes.as_ptr() as usize;
    let base = start - start % page;
    let len = start + bytes.len() - base;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `base..base+len` covers mapped memory owned by the caller's slice (rounded down to
    // its page), and `vec` has one byte per page as mincore requires.
    let rc = unsafe { libc::mincore(base as *mut libc::c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 == 1).count() as f64 / pages as f64)
}

/// Asks the kernel to drop `path`'s clean pages from the page cache
/// (`posix_fadvise(POSIX_FADV_DONTNEED)`; no privileges needed). Pages mapped by a process
/// may stay until unmapped or reclaimed; check with [`residency`].
pub fn evict(path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path)?;
    // SAFETY: the descriptor is valid for the call; fadvise only gives the kernel a hint.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}
