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
//! One address range is reserved, the header pages are filled and made read-only, and every
//! tensor file is mapped over its slot with `MAP_FIXED`. Burnpack records each tensor as an
//! offset range from its data section; the offsets written here point at the slots, which
//! start on 16 KiB boundaries (burnpack itself only promises 256). Burn's reader windows into
//! the image without copying, so each recorded tensor's bytes are the file's page-cache pages.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

use burn::store::burn_pack::{Header, aligned_data_section_start};
use burn::tensor::DType;
use serde::Serialize;

use crate::error::StoreError;
use crate::layout::{ALIGNMENT, page_size};
use crate::manifest::Manifest;
use crate::map::open_checked;

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

/// Encodes the burnpack header and metadata for a data region starting at `data_start`.
fn encode_header(manifest: &Manifest, data_start: u64) -> Vec<u8> {
    // Burnpack offsets are relative to its data section, which follows the metadata at the
    // next 256-byte boundary; the metadata size depends on the offsets, so callers iterate.
    let mut metadata_len = 0usize;
    loop {
        let section = aligned_data_section_start(metadata_len) as u64;
        let mut cursor = data_start;
        let tensors = manifest
            .tensors()
            .iter()
            .map(|t| {
                let start = cursor - section;
                cursor += t.padded_len();
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
        if cbor.len() == metadata_len {
            let mut out = Header::new(cbor.len() as u32).into_bytes().to_vec();
            out.extend_from_slice(&cbor);
            return out;
        }
        metadata_len = cbor.len();
    }
}

/// Maps every tensor file of the store at `dir` into one burnpack image.
pub(crate) fn build(dir: &Path, manifest: &Manifest) -> Result<Arc<Image>, StoreError> {
    let page = page_size();
    if !ALIGNMENT.is_multiple_of(page as u64) {
        return Err(StoreError::UnsupportedPageSize {
            page,
            alignment: ALIGNMENT,
        });
    }
    // Validate every file before reserving anything.
    let files = manifest
        .tensors()
        .iter()
        .map(|entry| open_checked(dir, entry).map(|(file, _)| file))
        .collect::<Result<Vec<_>, _>>()?;
    let (header, data_start, total) = settle(manifest)?;

    let base = reserve(total)?;
    let mut image = Image {
        base,
        len: total,
        _files: Vec::new(),
    };
    write_header(&image, &header, data_start as usize)?;
    let mut offset = data_start as usize;
    for (entry, file) in manifest.tensors().iter().zip(&files) {
        let len = entry.padded_len() as usize;
        if len > 0 {
            map_fixed(&image, offset, len, file, entry.name())?;
        }
        offset += len;
    }
    image._files = files;
    Ok(Arc::new(image))
}

/// The header bytes, where the data starts, and the image's total length.
fn settle(manifest: &Manifest) -> Result<(Vec<u8>, u64, usize), StoreError> {
    // The header size depends on where data starts, and vice versa; settle both.
    let mut data_start = ALIGNMENT;
    let header = loop {
        let header = encode_header(manifest, data_start);
        let needed = round_up(header.len() as u64);
        if needed <= data_start {
            break header;
        }
        data_start = needed;
    };
    let total = data_start
        + manifest
            .tensors()
            .iter()
            .map(|t| t.padded_len())
            .sum::<u64>();
    let total = usize::try_from(total).map_err(|_| StoreError::Map {
        what: "image".into(),
        source: std::io::Error::new(std::io::ErrorKind::OutOfMemory, "image exceeds usize"),
    })?;
    Ok((header, data_start, total))
}

/// The same image as [`build`], read into one anonymous buffer instead of mapped: the copy
/// control of the benchmarks (same files, same record construction, owned storage).
pub(crate) fn read_owned(dir: &Path, manifest: &Manifest) -> Result<Vec<u8>, StoreError> {
    use std::io::Read;
    let files = manifest
        .tensors()
        .iter()
        .map(|entry| open_checked(dir, entry))
        .collect::<Result<Vec<_>, _>>()?;
    let (header, data_start, total) = settle(manifest)?;
    let mut image = vec![0u8; total];
    image[..header.len()].copy_from_slice(&header);
    let mut offset = data_start as usize;
    for (entry, (mut file, path)) in manifest.tensors().iter().zip(files) {
        let len = entry.padded_len() as usize;
        file.read_exact(&mut image[offset..offset + len])
            .map_err(|source| StoreError::Io {
                tensor: entry.name().to_string(),
                file: path,
                source,
            })?;
        offset += len;
    }
    Ok(image)
}

/// Reserves `len` bytes of address space aligned to [`ALIGNMENT`], inaccessible until mapped.
fn reserve(len: usize) -> Result<*mut u8, StoreError> {
    let align = ALIGNMENT as usize;
    let over = len + align;
    // SAFETY: an anonymous PROT_NONE reservation touches no existing memory.
    let raw = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            over,
            libc::PROT_NONE,
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
    // by construction), so MAP_FIXED replaces only our own PROT_NONE pages. The file is at
    // least `len` bytes long (checked by `open_checked`), so no page of the mapping lies past
    // end of file.
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
    Ok(())
}
