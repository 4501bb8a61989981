//! The store's error type. Every variant names the tensor and/or file it is about, so a
//! message read in a log is enough to find the bad input.

use std::io;
use std::path::PathBuf;

/// Errors from reading, writing, mapping and verifying a store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The manifest could not be read.
    #[error("{}: cannot read manifest: {source}", path.display())]
    ManifestIo {
        /// Manifest path.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The manifest is larger than [`crate::manifest::MAX_MANIFEST_BYTES`].
    #[error("{}: manifest is {len} bytes, over the {max}-byte limit", path.display())]
    ManifestTooLarge {
        /// Manifest path.
        path: PathBuf,
        /// Its length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("{}: malformed manifest: {source}", path.display())]
    ManifestSyntax {
        /// Manifest path.
        path: PathBuf,
        /// Parser error (line and column included).
        source: serde_json::Error,
    },
    /// The manifest is of a format version this build does not read.
    #[error("{}: unsupported store format `{format}` version {version} (this build reads `burn-mapped` version {supported})", path.display())]
    UnsupportedVersion {
        /// Manifest path.
        path: PathBuf,
        /// Format tag found.
        format: String,
        /// Version found.
        version: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The manifest declares an alignment other than the one this build writes and maps.
    #[error("{}: store alignment {found} is not supported (expected {expected})", path.display())]
    UnsupportedAlignment {
        /// Manifest path.
        path: PathBuf,
        /// Alignment found.
        found: u64,
        /// Alignment expected.
        expected: u64,
    },
    /// A manifest-wide limit was exceeded.
    #[error("{}: {what} is {found}, over the limit of {max}", path.display())]
    LimitExceeded {
        /// Manifest path.
        path: PathBuf,
        /// What was counted.
        what: &'static str,
        /// Count found.
        found: u64,
        /// The limit.
        max: u64,
    },
    /// A tensor name is empty, too long or contains control characters.
    #[error("tensor `{tensor}`: invalid name: {reason}")]
    InvalidName {
        /// The name as found (escaped for printing).
        tensor: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// Two entries share a name.
    #[error("tensor `{tensor}` appears twice in the manifest")]
    DuplicateName {
        /// The repeated name.
        tensor: String,
    },
    /// Two entries share a file.
    #[error("tensors `{tensor}` and `{other}` both use file `{file}`")]
    DuplicateFile {
        /// Second tensor.
        tensor: String,
        /// First tensor.
        other: String,
        /// The shared file name.
        file: String,
    },
    /// A file name could escape the store directory or is otherwise unusable.
    #[error(
        "tensor `{tensor}`: file name `{file}` is not a plain file name inside the store ({reason})"
    )]
    UnsafeFileName {
        /// Tensor.
        tensor: String,
        /// File name as found.
        file: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A dtype string this build does not know.
    #[error("tensor `{tensor}` (file `{file}`): unknown dtype `{dtype}`")]
    UnknownDType {
        /// Tensor.
        tensor: String,
        /// File name.
        file: String,
        /// The dtype string found.
        dtype: String,
    },
    /// The logical length does not equal shape x element size.
    #[error(
        "tensor `{tensor}` (file `{file}`): length {len} bytes does not match shape {shape:?} of {dtype} ({expected} bytes)"
    )]
    LengthMismatch {
        /// Tensor.
        tensor: String,
        /// File name.
        file: String,
        /// Declared length.
        len: u64,
        /// Declared shape.
        shape: Vec<u64>,
        /// Declared dtype.
        dtype: String,
        /// shape x element size, or `None` on overflow.
        expected: ExpectedLen,
    },
    /// A tensor has more dimensions than a store holds.
    #[error("tensor `{tensor}`: rank {rank} is over the limit of {max} dimensions")]
    RankTooHigh {
        /// Tensor.
        tensor: String,
        /// Its number of dimensions.
        rank: usize,
        /// [`crate::manifest::MAX_RANK`].
        max: usize,
    },
    /// A checkpoint file to be read in place cannot be opened, locked or mapped.
    #[error("checkpoint {}: {source}", file.display())]
    Checkpoint {
        /// The file.
        file: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A checkpoint file read in place is not valid GGUF.
    #[error("{}: {source}", file.display())]
    Gguf {
        /// The file.
        file: PathBuf,
        /// What is wrong with it (boxed: it is large and rare).
        source: Box<crate::gguf::GgufError>,
    },
    /// A GGUF tensor of a type nothing here reads.
    #[error(
        "{}: tensor `{tensor}`: GGUF type {ty} has no reader here (supported: F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q6_K)",
        file.display()
    )]
    GgufType {
        /// The file.
        file: PathBuf,
        /// Tensor.
        tensor: String,
        /// The type's name.
        ty: &'static str,
    },
    /// A tensor of a checkpoint read in place does not fit the file as its header says.
    #[error("{}: tensor `{tensor}`: {reason}", file.display())]
    BadView {
        /// The file.
        file: PathBuf,
        /// Tensor.
        tensor: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A checksum string is not 16 hex digits.
    #[error("tensor `{tensor}` (file `{file}`): checksum `{found}` is not a 64-bit hex value")]
    BadChecksum {
        /// Tensor.
        tensor: String,
        /// File name.
        file: String,
        /// What was found.
        found: String,
    },
    /// A tensor's GGUF block layout does not describe its bytes.
    #[error("tensor `{tensor}`: bad block layout: {reason}")]
    BadBlocks {
        /// The block tensor.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// A quantization link names a tensor that is absent or unsuitable.
    #[error("tensor `{tensor}`: quantization link to `{scale}`: {reason}")]
    BadQuantLink {
        /// The quantized weight.
        tensor: String,
        /// The linked scale tensor.
        scale: String,
        /// Why the link is rejected.
        reason: &'static str,
    },
    /// A tensor file is absent.
    #[error("tensor `{tensor}`: file {} is missing", file.display())]
    MissingFile {
        /// Tensor.
        tensor: String,
        /// Full path of the file.
        file: PathBuf,
    },
    /// A tensor file is shorter than its padded length (mapping it would fault).
    #[error("tensor `{tensor}`: file {} is {actual} bytes, shorter than the {expected} bytes the manifest implies", file.display())]
    ShortFile {
        /// Tensor.
        tensor: String,
        /// Full path of the file.
        file: PathBuf,
        /// Actual size.
        actual: u64,
        /// Padded length the manifest implies.
        expected: u64,
    },
    /// I/O on a tensor file failed.
    #[error("tensor `{tensor}`: file {}: {source}", file.display())]
    Io {
        /// Tensor.
        tensor: String,
        /// Full path of the file.
        file: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// I/O on the store directory failed.
    #[error("store {}: {source}", dir.display())]
    DirIo {
        /// Store directory (or the temporary directory being written).
        dir: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// A file's bytes do not hash to the manifest's checksum.
    #[error("tensor `{tensor}`: file {} has checksum {actual:016x}, manifest says {expected:016x}", file.display())]
    ChecksumMismatch {
        /// Tensor.
        tensor: String,
        /// Full path of the file.
        file: PathBuf,
        /// Manifest checksum.
        expected: u64,
        /// Computed checksum.
        actual: u64,
    },
    /// The zero padding after a tensor holds non-zero bytes.
    #[error("tensor `{tensor}`: file {} has non-zero bytes in its padding", file.display())]
    DirtyPadding {
        /// Tensor.
        tensor: String,
        /// Full path of the file.
        file: PathBuf,
    },
    /// The writer was handed a different number of bytes than it was told.
    #[error("tensor `{tensor}`: writer received {actual} bytes, expected {expected}")]
    WrongByteCount {
        /// Tensor.
        tensor: String,
        /// Bytes declared.
        expected: u64,
        /// Bytes received.
        actual: u64,
    },
    /// A dtype the store cannot hold (e.g. Burn's packed quantized tensors).
    #[error("tensor `{tensor}`: dtype {dtype} cannot be stored")]
    UnsupportedDType {
        /// Tensor.
        tensor: String,
        /// Burn dtype, printed.
        dtype: String,
    },
    /// The device the module loads onto cannot hold a stored dtype (NdArray has no f16/bf16).
    #[error("tensor `{tensor}` (file {}): dtype {dtype} is not supported on {device}; convert the store to a dtype it supports (e.g. f32)", file.display())]
    DeviceDType {
        /// Tensor.
        tensor: String,
        /// Tensor file.
        file: PathBuf,
        /// Manifest dtype name.
        dtype: String,
        /// The device, printed.
        device: String,
    },
    /// A tensor asked for is not in the store.
    #[error("tensor `{tensor}` is not in store {}", dir.display())]
    TensorNotFound {
        /// Tensor.
        tensor: String,
        /// Store directory.
        dir: PathBuf,
    },
    /// The module's parameter has a different shape than the stored tensor.
    #[error("tensor `{tensor}`: module expects shape {expected:?}, store {} has {found:?}", dir.display())]
    ShapeMismatch {
        /// Tensor.
        tensor: String,
        /// Store directory.
        dir: PathBuf,
        /// Shape the module expects.
        expected: Vec<usize>,
        /// Shape in the store.
        found: Vec<usize>,
    },
    /// The module's parameter has a different dtype than the stored tensor.
    #[error("tensor `{tensor}`: module expects dtype {expected}, store {} has {found}", dir.display())]
    DTypeMismatch {
        /// Tensor.
        tensor: String,
        /// Store directory.
        dir: PathBuf,
        /// Dtype the module expects.
        expected: String,
        /// Dtype in the store.
        found: String,
    },
    /// Rows asked of a tensor that it does not have (or of a tensor without rows).
    #[error("tensor `{tensor}` of store {}: rows {start}..{end} asked, it has {rows}", dir.display())]
    RowsOutOfRange {
        /// Tensor.
        tensor: String,
        /// Store directory.
        dir: PathBuf,
        /// First row asked.
        start: usize,
        /// One past the last row asked.
        end: usize,
        /// Rows the tensor has (its first dimension; 0 for a scalar).
        rows: usize,
    },
    /// Module parameters absent from the store, or stored tensors no parameter took.
    #[error("store {}: {what}: {}", dir.display(), tensors.join(", "))]
    Unmatched {
        /// Store directory.
        dir: PathBuf,
        /// "missing from the store" or "not used by the module".
        what: &'static str,
        /// The tensor names.
        tensors: Vec<String>,
    },
    /// Write access to mapped bytes was requested.
    #[error("tensor `{tensor}` is a read-only file mapping; write access refused")]
    ReadOnly {
        /// Tensor.
        tensor: String,
    },
    /// This system's pages are larger than the store alignment, so files cannot be placed at
    /// page-aligned addresses back to back.
    #[error("page size {page} does not divide the store alignment {alignment}")]
    UnsupportedPageSize {
        /// System page size.
        page: usize,
        /// Store alignment.
        alignment: u64,
    },
    /// Reserving or mapping address space failed.
    #[error("mapping {what}: {source}")]
    Map {
        /// What was being mapped.
        what: String,
        /// Underlying error.
        source: io::Error,
    },
    /// The tensors' padded sizes add up past [`MAX_STORE_BYTES`](crate::manifest::MAX_STORE_BYTES).
    #[error("tensor `{tensor}`: the store's files add up past {max} bytes")]
    StoreTooLarge {
        /// The tensor at which the sum passed the limit.
        tensor: String,
        /// The limit.
        max: u64,
    },
    /// A writer was pointed at something that is not a store (a file, a link, or a directory
    /// with other contents); nothing there was touched.
    #[error("{} exists and is not a burn-mapped store ({reason}); refusing to replace it", dir.display())]
    NotAStore {
        /// The target.
        dir: PathBuf,
        /// What was found.
        reason: &'static str,
    },
    /// A writer was pointed at a path that cannot become a store (`.`, `..`, `/`); nothing
    /// was touched.
    #[error("cannot write a store at {}: {reason}", dir.display())]
    BadTarget {
        /// The target.
        dir: PathBuf,
        /// Why.
        reason: &'static str,
    },
    /// A store to be replaced holds a file its manifest does not name (the user's, most
    /// likely); nothing was touched.
    #[error(
        "store {} holds `{file}`, which is not part of the store; refusing to replace it (move the file elsewhere first)",
        dir.display()
    )]
    ForeignFile {
        /// The store.
        dir: PathBuf,
        /// The file's name in it.
        file: String,
    },
    /// A store needs more open files (one per tensor, kept open while mapped) than the
    /// process may open, even after raising its soft limit to the hard one.
    #[error(
        "store {} maps {needed} tensor files, but this process may open only {limit} files (hard limit {hard}); raise it (`ulimit -n`) and retry",
        dir.display()
    )]
    TooManyFiles {
        /// The store.
        dir: PathBuf,
        /// Files the store needs open, with a margin for the rest of the process.
        needed: u64,
        /// The soft limit after trying to raise it.
        limit: u64,
        /// The hard limit.
        hard: u64,
    },
    /// A manifest's entries do not hash to the digest it records: entries were edited,
    /// reordered or exchanged after the store was written.
    #[error(
        "{}: the manifest's entries do not match its digest (recorded {recorded}, computed {computed}): entries were edited or rearranged",
        path.display()
    )]
    ManifestDigest {
        /// The manifest file.
        path: PathBuf,
        /// The digest it records.
        recorded: String,
        /// The digest of its entries.
        computed: String,
    },
    /// A writer was pointed at an existing store without being allowed to replace it.
    #[error("{} is an existing store; replacing it was not requested", dir.display())]
    StoreExists {
        /// The target.
        dir: PathBuf,
    },
    /// Burn's own record reader refused the image (a bug in this crate if it happens).
    #[error("burnpack image rejected by burn: {0}")]
    Record(String),
    /// The GPU refused a step of a tensor's upload.
    #[error("tensor `{tensor}`: upload to the device failed: {reason}")]
    Upload {
        /// The tensor.
        tensor: String,
        /// What failed.
        reason: String,
    },
}

/// The length implied by a shape, or overflow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectedLen {
    /// shape x element size fits in u64.
    Bytes(u64),
    /// shape x element size overflows u64.
    Overflow,
}

impl std::fmt::Display for ExpectedLen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExpectedLen::Bytes(n) => write!(f, "{n}"),
            ExpectedLen::Overflow => f.write_str("overflow"),
        }
    }
}
