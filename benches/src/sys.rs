//! Page-cache and process probes the harness needs beside `burn_mapped::host::memstat`: warming and
//! evicting an arm's files, confirming either with `mincore`, and the machine's load.

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use burn_mapped::host::memstat;

/// Every regular file of `path` (a directory, not recursive) or `path` itself.
pub fn files_of(path: &Path) -> io::Result<Vec<PathBuf>> {
    if path.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

/// Total length of `files`.
pub fn total_len(files: &[PathBuf]) -> io::Result<u64> {
    files
        .iter()
        .try_fold(0, |acc, f| Ok(acc + std::fs::metadata(f)?.len()))
}

/// Brings every page of `files` into the page cache by faulting it through a read-only shared
/// mapping advised `MADV_HUGEPAGE`, the way a mapped loader brings them in. The kernel then
/// caches the pages as huge folios where it can; a `read()` loop would leave small ones, which
/// stay small while cached and cannot be mapped huge by any arm. Every arm's input is warmed
/// this way (the burnpack's pages are mapped huge by the stock-best arm too).
pub fn warm(files: &[PathBuf]) -> io::Result<u64> {
    let mut total = 0;
    for path in files {
        let file = std::fs::File::open(path)?;
        if file.metadata()?.len() == 0 {
            continue;
        }
        // SAFETY: read-only mapping of a benchmark input that nothing modifies while the
        // harness runs; it is dropped before this function returns.
        let map = unsafe { memmap2::Mmap::map(&file) }?;
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        let mut sink = 0u8;
        for page in map.chunks(4096) {
            sink ^= page[0];
        }
        std::hint::black_box(sink);
        total += map.len() as u64;
    }
    Ok(total)
}

/// Drops the clean page-cache pages of `files` (`posix_fadvise(POSIX_FADV_DONTNEED)`).
pub fn evict(files: &[PathBuf]) -> io::Result<()> {
    for path in files {
        memstat::evict(path).map_err(|e| annotate(path, e))?;
    }
    Ok(())
}

/// Fraction of the bytes of `files` in the page cache, weighted by length, from `mincore`
/// over a fresh read-only mapping (mapping faults nothing in).
pub fn residency(files: &[PathBuf]) -> io::Result<f64> {
    let (mut resident, mut total) = (0.0, 0.0);
    for path in files {
        let file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        if len == 0 {
            continue;
        }
        // SAFETY: the mapping is only passed to mincore, never read, so a concurrent change
        // to the file cannot be observed through it.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| annotate(path, e))?;
        resident += memstat::residency(&map).map_err(|e| annotate(path, e))? * len as f64;
        total += len as f64;
    }
    Ok(if total == 0.0 { 1.0 } else { resident / total })
}

fn annotate(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub fn mem_available() -> io::Result<u64> {
    meminfo("MemAvailable:")
}

/// `MemTotal` from `/proc/meminfo`, in bytes.
pub fn mem_total() -> io::Result<u64> {
    meminfo("MemTotal:")
}

fn meminfo(key: &str) -> io::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo")?;
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no {key} in meminfo")))
}

/// The CPU's model name from `/proc/cpuinfo`.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|r| r.trim_start_matches([' ', '\t', ':']).trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The running kernel's release (`/proc/sys/kernel/osrelease`), empty when unreadable.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The 1-minute load average (other work on the machine shows here).
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Address ranges of this process's mappings of files under `dir`.
pub fn mappings_under(dir: &Path) -> io::Result<Vec<Range<usize>>> {
    let dir = std::fs::canonicalize(dir)?;
    let prefix = format!("{}/", dir.display());
    let maps = std::fs::read_to_string("/proc/self/maps")?;
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let range = parts.next().unwrap_or("");
        let path = line.split_whitespace().nth(5).unwrap_or("");
        if !path.starts_with(&prefix) {
            continue;
        }
        if let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            out.push(lo..hi);
        }
    }
    Ok(out)
}

/// Other processes that map a file under `dir` (their pages cannot be reclaimed from here).
pub fn other_mappers(dir: &Path) -> io::Result<Vec<u32>> {
    let dir = std::fs::canonicalize(dir)?;
    let prefix = format!("{}/", dir.display());
    let me = std::process::id();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let Ok(pid) = entry?.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == me {
            continue;
        }
        // Processes may exit or be unreadable meanwhile; skip those.
        if let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps"))
            && maps.lines().any(|l| {
                l.split_whitespace()
                    .nth(5)
                    .is_some_and(|p| p.starts_with(&prefix))
            })
        {
            pids.push(pid);
        }
    }
    Ok(pids)
}

/// Fraction of the pages of `ranges` (mappings of this process) in memory, via `mincore`.
pub fn ranges_residency(ranges: &[Range<usize>]) -> io::Result<f64> {
    let page = burn_mapped::host::page_size();
    let (mut resident, mut total) = (0usize, 0usize);
    let mut vec = Vec::new();
    for r in ranges {
        let pages = (r.end - r.start).div_ceil(page);
        vec.clear();
        vec.resize(pages, 0u8);
        // SAFETY: `r` is a page-aligned range of a live mapping of this process (from
        // /proc/self/maps, still mapped by the caller); `vec` has one byte per page.
        let rc = unsafe {
            libc::mincore(
                r.start as *mut libc::c_void,
                r.end - r.start,
                vec.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        resident += vec.iter().filter(|&&b| b & 1 == 1).count();
        total += pages;
    }
    Ok(if total == 0 {
        1.0
    } else {
        resident as f64 / total as f64
    })
}

/// How [`page_out`] dropped the pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PageOut {
    /// `madvise(MADV_PAGEOUT)`: the kernel reclaims the pages as memory pressure would.
    MadvPageout,
    /// `madvise(MADV_DONTNEED)` (kernels before 5.4): unmaps them; `fadvise` then drops them.
    MadvDontneed,
}

/// `madvise(advice)` on the pages of `range`.
///
/// # Safety
///
/// `range` is mapped in this process, and `advice` changes nothing a later access to it sees.
unsafe fn madvise(range: &Range<usize>, advice: libc::c_int) -> io::Result<()> {
    // SAFETY: the caller's contract.
    let rc = unsafe {
        libc::madvise(
            range.start as *mut libc::c_void,
            range.end - range.start,
            advice,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reclaims the pages of `ranges` (read-only shared file mappings of this process) and then
/// drops `files` from the page cache, so the next access faults them in from storage.
pub fn page_out(ranges: &[Range<usize>], files: &[PathBuf]) -> io::Result<PageOut> {
    let mut method = PageOut::MadvPageout;
    for r in ranges {
        // SAFETY: `r` is a read-only MAP_SHARED file mapping of this process. Reclaiming or
        // unmapping its clean pages never changes what a later read sees (the page is read
        // back from the unmodified file), so references into it stay valid.
        if let Err(err) = unsafe { madvise(r, libc::MADV_PAGEOUT) } {
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(err);
            }
            method = PageOut::MadvDontneed;
            // SAFETY: as above; MADV_DONTNEED on a shared file mapping only drops the page
            // table entries, and the next access maps the file's page again.
            unsafe { madvise(r, libc::MADV_DONTNEED) }?;
        }
    }
    evict(files)?;
    Ok(method)
}
