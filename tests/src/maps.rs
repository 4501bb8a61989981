//! Where this process maps files, read from `/proc/self/maps`: independent of the bookkeeping of
//! the code under test, so a test can tell adopted pages from copies.

use std::ops::Range;
use std::path::Path;

use burn_mapped::Manifest;

/// Address ranges where the file `path` is mapped in this process.
pub fn mapped_ranges(path: &Path) -> Vec<Range<usize>> {
    let path = std::fs::canonicalize(path).unwrap();
    let path = path.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/maps")
        .unwrap()
        .lines()
        .filter(|l| l.split_whitespace().nth(5) == Some(path.as_str()))
        .map(|l| {
            let (lo, hi) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            usize::from_str_radix(lo, 16).unwrap()..usize::from_str_radix(hi, 16).unwrap()
        })
        .collect()
}

/// Every mapping of every tensor file of the store at `dir`.
pub fn store_mappings(dir: &Path) -> Vec<Range<usize>> {
    Manifest::read(dir)
        .unwrap()
        .tensors()
        .iter()
        .flat_map(|t| mapped_ranges(&dir.join(t.file())))
        .collect()
}

/// Whether `range` lies wholly inside one of `maps`.
pub fn inside_a_mapping(range: &Range<usize>, maps: &[Range<usize>]) -> bool {
    maps.iter()
        .any(|m| m.start <= range.start && range.end <= m.end)
}

/// Whether `range` shares a byte with one of `maps`.
pub fn overlaps_a_mapping(range: &Range<usize>, maps: &[Range<usize>]) -> bool {
    maps.iter()
        .any(|m| m.start < range.end && range.start < m.end)
}
