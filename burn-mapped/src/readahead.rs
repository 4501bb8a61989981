//! Reading a store's pages from storage ahead of their first use, on threads of their own.
//!
//! A process that starts with its weights out of the page cache (the first run after a boot,
//! or after other files pushed them out) otherwise reads them through page faults as the
//! model first touches each tensor: a layer's compute waits for its pages, then the disk
//! waits for the next layer's faults, the threads faulting wherever their rows lie. Here a
//! few threads of its own fault every tensor in (`MADV_POPULATE_READ`), in file order, while
//! the model loads and the prompt's first layers compute (docs/PERFORMANCE.md, "Cold starts").
//!
//! Faulting, not `MADV_WILLNEED`: a fault on a mapping advised `MADV_HUGEPAGE` reads the file
//! in 2 MiB folios that the process maps whole, while `MADV_WILLNEED` fills the page cache
//! with 4 KiB folios, which every later process then maps a page at a time: on a 2-core VM a
//! 7B decode ran 12 % slower from such a cache. On a warm cache the threads only map what is
//! there, which the first kernels to read it would otherwise do.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::map::MappedFile;

/// Span faulted in by one `madvise`: a few huge pages, so that the compute threads, faulting
/// the same pages, rarely wait long behind a call.
const SPAN: usize = 8 << 20;

/// Threads faulting spans at once: a fault reads its 2 MiB folios and the next ones, so one
/// thread keeps one or two reads in flight, too few for a virtual disk's throughput. The
/// threads mostly wait on storage, not on a core.
const THREADS: usize = 4;

/// Byte ranges of mappings to read ahead, in the order given.
pub(crate) struct ReadAhead {
    ranges: Vec<(Arc<MappedFile>, Range<usize>)>,
}

impl ReadAhead {
    /// `ranges`: each a mapping and a byte range inside it.
    pub(crate) fn new(ranges: Vec<(Arc<MappedFile>, Range<usize>)>) -> Self {
        Self { ranges }
    }

    /// Bytes the ranges cover.
    pub(crate) fn bytes(&self) -> u64 {
        self.ranges.iter().map(|(_, r)| r.len() as u64).sum()
    }

    /// Starts the reads on threads of their own and returns at once; a thread that cannot be
    /// started leaves its share to the others, or the pages to be read as they are touched.
    /// The threads hold the mappings until the last span is faulted in.
    pub(crate) fn start(self) {
        let page = crate::layout::page_size();
        // The ranges cut into spans, in order, each a whole number of pages.
        let mut spans = Vec::new();
        for (i, (file, range)) in self.ranges.iter().enumerate() {
            let bytes = &file.bytes()[range.clone()];
            // The mapping starts on a page, so the page holding the first byte is inside it.
            let mut at = bytes.as_ptr() as usize / page * page;
            let end = bytes.as_ptr() as usize + bytes.len();
            while at < end {
                let len = (end - at).min(SPAN);
                spans.push((i, at, len));
                at += len;
            }
        }
        let work = Arc::new(Work {
            ranges: self.ranges,
            spans,
            next: AtomicUsize::new(0),
        });
        for _ in 0..THREADS {
            let work = Arc::clone(&work);
            let spawned = std::thread::Builder::new()
                .name("burn-mapped-readahead".into())
                .spawn(move || work.run());
            if let Err(e) = spawned {
                log::debug!("no read-ahead thread: {e}");
            }
        }
    }
}

/// The spans the read-ahead threads claim in file order, and the mappings they lie in.
struct Work {
    ranges: Vec<(Arc<MappedFile>, Range<usize>)>,
    /// (range index, address, length).
    spans: Vec<(usize, usize, usize)>,
    next: AtomicUsize,
}

impl Work {
    fn run(&self) {
        loop {
            let k = self.next.fetch_add(1, Ordering::Relaxed);
            let Some(&(i, at, len)) = self.spans.get(k) else {
                return;
            };
            // SAFETY: [at, at + len) lies inside the live read-only mapping of range `i`,
            // which `self` holds; MADV_POPULATE_READ faults its pages in for reading and
            // changes no contents.
            let rc =
                unsafe { libc::madvise(at as *mut libc::c_void, len, libc::MADV_POPULATE_READ) };
            if rc != 0 {
                // Before Linux 5.14 (EINVAL), or a file cut short under the mapping: the
                // kernels' own faults read what is left.
                log::debug!(
                    "read-ahead of {} stopped: {}",
                    self.ranges[i].0.path().display(),
                    std::io::Error::last_os_error()
                );
                self.next.store(self.spans.len(), Ordering::Relaxed);
                return;
            }
        }
    }
}
