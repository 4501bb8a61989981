//! A burnpack image assembled from per-tensor mappings, so Burn's own
//! [`ModuleRecord::from_bytes`](burn::store::ModuleRecord::from_bytes) adopts a store with no
//! copy.
//!
//! ```text
//!  base (16 KiB aligned)                      base + D          base + D + p0
//!  | burnpack header + CBOR metadata | zeros | tensor 0 file (p0) | tensor 1 file (p1) | ...
//!  '-- anonymous, PROT_READ ----------------' '-- MAP_SHARED | MAP_FIXED, PROT_READ each --'
//! ```
//!
//! One readable address range is reserved, the header pages are filled and made read-only, and
//! every tensor file is mapped over its slot with `MAP_FIXED`. Burnpack records each tensor as an
//! offset range from its data section; the offsets written here point at the slots, which
//! start on 16 KiB boundaries (burnpack itself only promises 256). Burn's reader windows into
//! the image without copying, so each recorded tensor's bytes are the file's page-cache pages.
//!
//! A tensor of at least one huge page ([`huge_page_size`], 2 MiB on x86-64) starts on a
//! huge-page boundary of the address space, and its slot is advised `MADV_HUGEPAGE`: the kernel
//! can then map the file's large page-cache folios with one TLB entry per 2 MiB instead of 512,
//! as it does for a burnpack file mapped whole. (Measured on the Qwen2.5 f32 store: without
//! this, decoding from the store's pages ran ~30 % slower than from the same weights in one
//! mapped burnpack file, whose pages were PMD-mapped.) The gaps are reserved address space
//! only: never touched, never resident. The advice shapes pages the kernel reads from disk
//! and the writer's aligned 4 MiB writes shape pages it caches on write; pages some other
//! reader brought in with `read()` stay small while they are cached, and map small.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use burn::store::burn_pack::{Header, aligned_data_section_start};
use burn::tensor::DType;
use serde::Serialize;

use crate::error::StoreError;
use crate::generation::Generation;
use crate::layout::{ALIGNMENT, huge_page_size, page_size};
use crate::manifest::Manifest;

// Field names and shapes follow burnpack's CBOR metadata (format version 1).
#[derive(Serialize)]
struct PackMetadata {
    tensors: BTreeMap<String, PackDescriptor>,
}

#[derive(Serialize)]
struct PackDescriptor {
    dtype: DType,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
    #[serde(skip_serializing_if = "Option::is_none")]
    param_id: Option<u64>,
}

/// The reserved range with the header and every tensor file mapped into it.
pub(crate) struct Image {
    base: *mut u8,
    len: usize,
    // Open descriptors keep the shared advisory locks for as long as the image is mapped.
    _files: Vec<File>,
    // Unregistered just after `Drop` unmaps the range (fields drop after `drop` runs); nothing
    // reads an image that is being dropped, so no fault can meet a stale entry in between.
    _faults: Vec<crate::fault::Registration>,
}

// SAFETY: the image is immutable after construction (every page is PROT_READ) and owns its
// mapping; sharing read-only memory across threads is sound.
unsafe impl Send for Image {}
// SAFETY: as above; `&Image` only allows reads.
unsafe impl Sync for Image {}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is exactly the range this image reserved and nothing else
        // refers to it once the last owner drops.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

impl AsRef<[u8]> for Image {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the whole range is mapped readable for the image's lifetime.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGNMENT) * ALIGNMENT
}

/// Where each tensor's slot starts in the image, and where the last one ends, for a data
/// region starting at `data_start`: slots follow each other, and one of at least a huge page
/// starts on a huge-page boundary.
///
/// Every step is checked, and the end must fit in `isize`: `build` reserves exactly
/// `0..end` and maps each file at its slot with `MAP_FIXED`, so a sum that wrapped would map a
/// file over memory the image does not own. The manifest caps its padded total
/// ([`MAX_STORE_BYTES`](crate::manifest::MAX_STORE_BYTES)), which keeps real stores far from the limit.
fn slots(manifest: &Manifest, data_start: u64) -> Result<(Vec<u64>, u64), StoreError> {
    let huge = huge_page_size();
    let mut cursor = data_start;
    let mut offsets = Vec::with_capacity(manifest.tensors().len());
    for t in manifest.tensors() {
        let too_large = || StoreError::StoreTooLarge {
            tensor: t.name().to_string(),
            max: isize::MAX as u64,
        };
        if t.padded_len() >= huge {
            cursor = cursor
                .checked_next_multiple_of(huge)
                .ok_or_else(too_large)?;
        }
        let start = cursor;
        cursor = cursor
            .checked_add(t.padded_len())
            .filter(|&end| end <= isize::MAX as u64)
            .ok_or_else(too_large)?;
        offsets.push(start);
    }
    Ok((offsets, cursor))
}

/// Encodes burnpack's CBOR metadata for tensors at image offsets `slots`, assuming the
/// metadata is `metadata_len` bytes long: burnpack offsets are relative to its data section,
/// which follows the metadata at the next 256-byte boundary, so the two depend on each other
/// and [`settle`] iterates to a fixed point.
fn encode_metadata(manifest: &Manifest, slots: &[u64], metadata_len: usize) -> Vec<u8> {
    let section = aligned_data_section_start(metadata_len) as u64;
    let tensors = manifest
        .tensors()
        .iter()
        .zip(slots)
        .map(|(t, &slot)| {
            let start = slot - section;
            let descriptor = PackDescriptor {
                dtype: t.dtype(),
                shape: t.shape().iter().map(|&d| d as u64).collect(),
                data_offsets: (start, start + t.len()),
                param_id: t.param_id(),
            };
            (t.name().to_string(), descriptor)
        })
        .collect();
    let mut cbor = Vec::new();
    ciborium::ser::into_writer(&PackMetadata { tensors }, &mut cbor)
        .expect("serializing into a Vec cannot fail");
    cbor
}

/// Maps every tensor file of the store at `dir` into one burnpack image; returns it with the
/// manifest of the generation it was built from.
pub(crate) fn build(dir: &Path) -> Result<(Arc<Image>, Manifest), StoreError> {
    let page = page_size();
    if !ALIGNMENT.is_multiple_of(page as u64) {
        return Err(StoreError::UnsupportedPageSize {
            page,
            alignment: ALIGNMENT,
        });
    }
    let generation = Generation::open(dir)?;
    let manifest = generation.manifest()?;
    // Settle the geometry (pure arithmetic) and validate every file before reserving anything.
    let layout = settle(&manifest)?;
    let files = generation.open_all(manifest.tensors())?;
    drop(generation);

    let base = reserve(layout.total, huge_page_size() as usize)?;
    let mut image = Image {
        base,
        len: layout.total,
        _files: Vec::new(),
        _faults: Vec::new(),
    };
    write_header(&image, &layout.header, layout.data_start as usize)?;
    for ((entry, (file, path)), &slot) in manifest.tensors().iter().zip(&files).zip(&layout.slots) {
        let len = entry.padded_len() as usize;
        if len > 0 {
            map_fixed(&image, slot as usize, len, file, entry.name())?;
            let start = image.base as usize + slot as usize;
            image
                ._faults
                .push(crate::fault::register(start..start + len, path));
        }
    }
    image._files = files.into_iter().map(|(file, _)| file).collect();
    Ok((Arc::new(image), manifest))
}

/// The image's header and geometry.
struct Layout {
    header: Vec<u8>,
    data_start: u64,
    slots: Vec<u64>,
    total: usize,
}

/// Settles the header, where the data starts and where each slot lies.
fn settle(manifest: &Manifest) -> Result<Layout, StoreError> {
    // Where data starts depends on the header's size, the header's content on where data
    // (and burnpack's own data section) starts: iterate to a fixed point, usually on the
    // second encoding. A longer header moves burnpack's section and so shortens the relative
    // offsets; should one of them flip between two CBOR integer widths, the lengths would
    // alternate, so every few passes the data moves one alignment step further out.
    let (mut data_start, mut metadata_len, mut pass) = (ALIGNMENT, 0usize, 0u32);
    loop {
        pass += 1;
        if pass.is_multiple_of(4) {
            data_start += ALIGNMENT;
        }
        let (slots, end) = slots(manifest, data_start)?;
        let cbor = encode_metadata(manifest, &slots, metadata_len);
        let header_len = Header::new(cbor.len() as u32).into_bytes().len() + cbor.len();
        let needed = round_up(header_len as u64);
        if cbor.len() == metadata_len && needed <= data_start {
            let total = usize::try_from(end).map_err(|_| StoreError::Map {
                what: "image".into(),
                source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, "image exceeds usize"),
            })?;
            let mut header = Header::new(cbor.len() as u32).into_bytes().to_vec();
            header.extend_from_slice(&cbor);
            return Ok(Layout {
                header,
                data_start,
                slots,
                total,
            });
        }
        metadata_len = cbor.len();
        data_start = data_start.max(needed);
    }
}

/// The same image as [`build`], read into one anonymous buffer instead of mapped: the copy
/// control of the benchmarks (same files, same record construction, owned storage).
pub(crate) fn read_owned(dir: &Path) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    let generation = Generation::open(dir)?;
    let manifest = generation.manifest()?;
    let layout = settle(&manifest)?;
    let files = generation.open_all(manifest.tensors())?;
    drop(generation);
    let mut image = vec![0u8; layout.total];
    image[..layout.header.len()].copy_from_slice(&layout.header);
    for ((entry, (mut file, path)), &slot) in
        manifest.tensors().iter().zip(files).zip(&layout.slots)
    {
        let (start, len) = (slot as usize, entry.padded_len() as usize);
        file.read_exact(&mut image[start..start + len])
            .map_err(|source| StoreError::Io {
                tensor: entry.name().to_string(),
                file: path,
                source,
            })?;
    }
    Ok(image)
}

/// Reserves `len` bytes of address space aligned to `align` (a power of two, at least a page).
/// The reservation is readable: the image is handed out as one `&[u8]`, so the gaps between
/// huge-page-aligned slots must be valid memory too; they read as zeros (the shared zero page,
/// never resident as anonymous memory) and nothing reads them.
fn reserve(len: usize, align: usize) -> Result<*mut u8, StoreError> {
    let over = len + align;
    // SAFETY: an anonymous read-only reservation touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_READ,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if raw == libc::MAP_FAILED {
        return Err(StoreError::Map {
            what: format!("reserving {over} bytes"),
            source: std::io::Error::last_os_error(),
        });
    }
    let start = raw as usize;
    let aligned = start.next_multiple_of(align);
    // Give back the slack on both sides so exactly `aligned..aligned+len` stays reserved.
    // SAFETY: both ranges lie inside the reservation just made and are page-aligned.
    unsafe {
        if aligned > start {
            libc::munmap(raw, aligned - start);
        }
        let end = aligned + len;
        if start + over > end {
            libc::munmap(end as *mut libc::c_void, start + over - end);
        }
    }
    Ok(aligned as *mut u8)
}

fn write_header(image: &Image, header: &[u8], len: usize) -> Result<(), StoreError> {
    let fail = |what: &str| StoreError::Map {
        what: what.to_string(),
        source: std::io::Error::last_os_error(),
    };
    // SAFETY: `base..base+len` is inside the reservation owned by `image`; it is made writable
    // (fresh zero pages), filled, and sealed read-only before anyone else can see it.
    unsafe {
        let p = libc::mmap(
            image.base.cast(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            return Err(fail("image header"));
        }
        std::ptr::copy_nonoverlapping(header.as_ptr(), image.base, header.len());
        if libc::mprotect(image.base.cast(), len, libc::PROT_READ) != 0 {
            return Err(fail("sealing image header"));
        }
    }
    Ok(())
}

fn map_fixed(
    image: &Image,
    offset: usize,
    len: usize,
    file: &File,
    tensor: &str,
) -> Result<(), StoreError> {
    // SAFETY: the target range lies inside the image's reservation (offset + len <= image.len
    // by `slots`' checked arithmetic, asserted below), so MAP_FIXED replaces only our own
    // reserved pages. The file is at least `len` bytes long (checked when it was opened), so
    // no page of the mapping lies past end of file.
    assert!(
        offset.checked_add(len).is_some_and(|end| end <= image.len),
        "image slot outside the reservation"
    );
    let p = unsafe {
        libc::mmap(
            image.base.add(offset).cast(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED | libc::MAP_FIXED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(StoreError::Map {
            what: format!("tensor `{tensor}`"),
            source: std::io::Error::last_os_error(),
        });
    }
    #[cfg(target_os = "linux")]
    if len as u64 >= huge_page_size() {
        // A hint, so its failure (a kernel without transparent huge pages) is not an error:
        // pages faulted in from disk come as huge folios where the kernel can, and cached huge
        // folios are mapped with one entry each.
        // SAFETY: madvise on a range this image owns changes no contents.
        unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    }
    Ok(())
}
