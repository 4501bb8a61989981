//! Layout arithmetic shared by the writer and the reader, so the two can never disagree.

/// Every tensor file is zero-padded to a multiple of this many bytes.
///
/// 16 KiB is the largest base page size in common use (Apple silicon, some arm64 Linux
/// kernels). Padding to it means a file's mapping never shares a page with another tensor on
/// 4 KiB or 16 KiB page systems, and GPU host-import APIs, which take whole pages, can import a
/// file as it is.
pub const ALIGNMENT: u64 = 16 * 1024;

const _: () = assert!(ALIGNMENT.is_power_of_two());
const _: () = assert!(ALIGNMENT.is_multiple_of(4096));

/// The on-disk length of a tensor whose logical length is `len`.
///
/// Returns `None` on overflow (a hostile manifest may declare any length).
pub fn padded_len(len: u64) -> Option<u64> {
    len.checked_add(ALIGNMENT - 1).map(|n| n & !(ALIGNMENT - 1))
}

/// The operating system's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions; it only reads a system constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// The size of a huge (PMD-level) page: the unit in which the kernel can map a large page-cache
/// folio with one TLB entry.
///
/// On Linux with transparent huge pages this is
/// `/sys/kernel/mm/transparent_hugepage/hpage_pmd_size` (2 MiB on x86-64 and on arm64 with
/// 4 KiB pages); elsewhere, or if that file is unreadable or implausible, 2 MiB. Large tensors
/// are placed at multiples of it in a mapped image so that their file pages can be mapped huge:
/// a PMD mapping needs the virtual address and the file offset congruent modulo this size.
pub fn huge_page_size() -> u64 {
    static SIZE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SIZE.get_or_init(|| {
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/hpage_pmd_size")
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .filter(|&n| n.is_power_of_two() && (ALIGNMENT..=1 << 30).contains(&n))
            .unwrap_or(2 << 20)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_rounds_up_to_the_alignment() {
        assert_eq!(padded_len(0), Some(0));
        assert_eq!(padded_len(1), Some(ALIGNMENT));
        assert_eq!(padded_len(ALIGNMENT), Some(ALIGNMENT));
        assert_eq!(padded_len(ALIGNMENT + 1), Some(2 * ALIGNMENT));
        assert_eq!(padded_len(u64::MAX), None);
    }

    #[test]
    fn the_huge_page_size_is_a_power_of_two_multiple_of_the_alignment() {
        let h = huge_page_size();
        assert!(h.is_power_of_two() && h.is_multiple_of(ALIGNMENT), "{h}");
    }
}
