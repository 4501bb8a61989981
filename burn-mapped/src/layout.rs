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
}
