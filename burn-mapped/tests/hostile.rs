//! Hostile stores and careless callers: nothing a writer did not write is removed, nothing
//! blocks, no size sum wraps, one load sees one generation, and a file truncated under a
//! mapping ends the process with a message naming it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use burn::tensor::DType;
use burn_mapped::{
    Existing, Manifest, MappedRecorder, MappedStore, StoreError, StoreWriter, TensorSpec,
    manifest::MANIFEST_FILE, readonly::SIGBUS_EXIT_CODE,
};
use burn_mapped_tests::synthetic::entry_names;

/// [`write_store`] at `store` under a fresh temporary directory: the directory's guard, the
/// store's path and its manifest.
fn temp_store(fill: u8, tensors: usize) -> (tempfile::TempDir, PathBuf, Manifest) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let manifest = write_store(&dir, fill, tensors);
    (tmp, dir, manifest)
}

fn write_store(dir: &Path, fill: u8, tensors: usize) -> Manifest {
    let mut writer = StoreWriter::create(dir).unwrap();
    writer.metadata("fill", fill.to_string());
    for i in 0..tensors {
        let spec = TensorSpec::new(format!("t{i}"), DType::U8, [5000 + i]);
        writer.add(spec, &vec![fill; 5000 + i]).unwrap();
    }
    writer.finish().unwrap()
}

fn mkfifo(path: &Path) {
    let name = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `name` is a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
}

/// Runs `f` on a thread and fails the test if it has not returned within `limit`, instead of
/// hanging the test run.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).expect("the call blocked")
}

/// `f(dir)` on another thread, which must return within 20 s (a hang is the failure).
fn on_dir_in_time<T: Send + 'static>(dir: &Path, f: impl FnOnce(&Path) -> T + Send + 'static) -> T {
    let dir = dir.to_path_buf();
    within(Duration::from_secs(20), move || f(&dir))
}

#[test]
fn a_writer_refuses_a_directory_that_is_not_a_store_and_leaves_it_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("photos");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("holiday.jpg"), b"precious").unwrap();
    let err = StoreWriter::create(&target).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
    assert_eq!(
        std::fs::read(target.join("holiday.jpg")).unwrap(),
        b"precious"
    );
    // Nothing left beside it either.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn a_writer_refuses_a_file_or_a_link_at_its_target() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("notes.txt");
    std::fs::write(&file, b"keep").unwrap();
    assert!(matches!(
        StoreWriter::create(&file).unwrap_err(),
        StoreError::NotAStore { .. }
    ));
    let real = tmp.path().join("real");
    write_store(&real, 1, 1);
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    assert!(matches!(
        StoreWriter::create(&link).unwrap_err(),
        StoreError::NotAStore { .. }
    ));
    assert_eq!(std::fs::read(&file).unwrap(), b"keep");
}

#[test]
fn a_directory_that_becomes_a_non_store_while_writing_is_still_refused_at_publish() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("out");
    let mut writer = StoreWriter::create(&target).unwrap();
    writer
        .add(TensorSpec::new("t", DType::U8, [3]), &[1, 2, 3])
        .unwrap();
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("mine"), b"x").unwrap();
    assert!(matches!(
        writer.finish().unwrap_err(),
        StoreError::NotAStore { .. }
    ));
    assert_eq!(std::fs::read(target.join("mine")).unwrap(), b"x");
}

#[test]
fn replacing_a_store_needs_to_be_asked_for() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("store");
    write_store(&target, 1, 2);
    let err = StoreWriter::create_with(&target, Existing::Refuse).unwrap_err();
    assert!(matches!(err, StoreError::StoreExists { .. }), "{err}");
    write_store(&target, 2, 3);
    let store = MappedStore::open(&target).unwrap();
    assert_eq!(store.manifest().tensors().len(), 3);
    // The replaced store's files are gone; only the new store and nothing else remains.
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
}

#[test]
fn an_empty_directory_is_a_valid_target() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("empty");
    std::fs::create_dir(&target).unwrap();
    let mut writer = StoreWriter::create_with(&target, Existing::Refuse).unwrap();
    writer
        .add(TensorSpec::new("t", DType::U8, [1]), &[7])
        .unwrap();
    writer.finish().unwrap();
    assert!(target.join(MANIFEST_FILE).is_file());
}

#[test]
fn a_killed_writers_temporary_directory_is_cleared_by_the_next_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("store");
    // What a writer killed mid-way leaves: its temporary directory, named and marked as
    // writers make them, no lock held.
    let abandoned = tmp.path().join(".store.tmp-4194303-0-0123456789abcdef");
    std::fs::create_dir(&abandoned).unwrap();
    std::fs::write(abandoned.join(".burn-mapped-writer"), b"").unwrap();
    std::fs::write(abandoned.join("00000-t.tensor"), vec![0u8; 16384]).unwrap();
    // A user's directories whose names start the same way, holding files a writer makes:
    // a backup copy of a store, and one named exactly like a writer's but never marked.
    let foreign = |name: &str| {
        let dir = tmp.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("manifest.json"), b"{}").unwrap();
        std::fs::write(dir.join("00000-t.tensor"), b"mine").unwrap();
        dir
    };
    let backup = foreign(".store.tmp-backup");
    let unmarked = foreign(".store.tmp-4194303-1-0123456789abcdef");
    let other_form = foreign(".store.tmp-4194303-2");
    write_store(&target, 3, 1);
    assert!(!abandoned.exists());
    for dir in [backup, unmarked, other_form] {
        assert_eq!(
            std::fs::read(dir.join("00000-t.tensor")).unwrap(),
            b"mine",
            "{}",
            dir.display()
        );
        assert!(dir.join("manifest.json").is_file());
    }
}

#[test]
fn replacing_a_store_never_moves_or_removes_a_file_it_does_not_name() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("store");
    write_store(&target, 3, 2);
    std::fs::write(target.join("notes.txt"), b"mine").unwrap();
    let err = {
        let mut writer = StoreWriter::create_with(&target, Existing::Replace);
        match writer.as_mut() {
            // Refused when the target is looked at, or else when it is replaced.
            Ok(w) => {
                w.add(TensorSpec::new("t", DType::U8, [1]), &[1]).unwrap();
                writer.unwrap().finish().unwrap_err()
            }
            Err(_) => writer.unwrap_err(),
        }
    };
    assert!(matches!(err, StoreError::ForeignFile { .. }), "{err}");
    assert!(err.to_string().contains("notes.txt"), "{err}");
    assert_eq!(std::fs::read(target.join("notes.txt")).unwrap(), b"mine");
    assert_eq!(Manifest::read(&target).unwrap().tensors().len(), 2);
    // Nothing hidden was left beside it.
    let names = entry_names(tmp.path());
    assert_eq!(names, ["store"], "{names:?}");
}

#[test]
fn a_replaced_store_leaves_no_directory_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("store");
    write_store(&target, 3, 2);
    write_store(&target, 4, 1);
    let names = entry_names(tmp.path());
    assert_eq!(names, ["store"], "{names:?}");
    assert_eq!(Manifest::read(&target).unwrap().metadata()["fill"], "4");
}

#[test]
fn a_target_that_names_no_new_directory_is_refused_by_what_it_is() {
    for target in [".", "..", "/", "store/."] {
        let err = StoreWriter::create(target).unwrap_err();
        assert!(
            matches!(err, StoreError::BadTarget { .. }),
            "{target}: {err}"
        );
    }
}

#[test]
fn a_manifest_whose_entries_were_rearranged_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut writer = StoreWriter::create(&dir).unwrap();
    for (name, fill) in [("a", 1u8), ("b", 2)] {
        writer
            .add(TensorSpec::new(name, DType::U8, [64]), &[fill; 64])
            .unwrap();
    }
    writer.finish().unwrap();
    // Swap the two names: every file still matches its entry's checksum.
    let path = dir.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&path).unwrap();
    let swapped = text
        .replace("\"name\": \"a\"", "\"name\": \"TMP\"")
        .replace("\"name\": \"b\"", "\"name\": \"a\"")
        .replace("\"name\": \"TMP\"", "\"name\": \"b\"");
    assert_ne!(swapped, text);
    std::fs::write(&path, swapped).unwrap();
    let err = MappedStore::open(&dir).unwrap_err();
    assert!(matches!(err, StoreError::ManifestDigest { .. }), "{err}");
    let err = burn_mapped::verify_dir(&dir, |_, _| {}).unwrap_err();
    assert!(matches!(err, StoreError::ManifestDigest { .. }), "{err}");
}

/// A store of more tensors than the common soft limit of 1024 open files opens and verifies
/// (the limit is raised towards the hard one); with a hard limit too low, the error says so.
/// Runs in a child process whose limits the test sets.
#[test]
fn a_store_of_more_files_than_the_soft_limit_opens_or_says_why_not() {
    const CHILD: &str = "BURN_MAPPED_NOFILE_CHILD";
    if let Ok(dir) = std::env::var(CHILD) {
        let outcome = match MappedStore::open(&dir) {
            Ok(store) => format!("opened {}", store.manifest().tensors().len()),
            Err(e) => format!("refused: {e}"),
        };
        let verified = burn_mapped::verify_dir(&dir, |_, _| {}).map(|p| p.len());
        println!("OUTCOME {outcome} VERIFY {verified:?}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut writer = StoreWriter::create(&dir).unwrap();
    for i in 0..1100 {
        writer
            .add(TensorSpec::new(format!("t{i}"), DType::U8, [1]), &[1])
            .unwrap();
    }
    writer.finish().unwrap();
    let run = |soft: u64, hard: u64| {
        let mut command = std::process::Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "--exact",
                "a_store_of_more_files_than_the_soft_limit_opens_or_says_why_not",
                "--nocapture",
            ])
            .env(CHILD, &dir);
        // SAFETY: setrlimit is async-signal-safe and touches no memory of the parent.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(move || {
                let limit = libc::rlimit {
                    rlim_cur: soft,
                    rlim_max: hard,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
        let out = command.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut hard = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) },
        0
    );
    if hard.rlim_max >= 4096 {
        let out = run(1024, hard.rlim_max);
        assert!(out.contains("OUTCOME opened 1100 VERIFY Ok(0)"), "{out}");
    }
    let out = run(1024, 1024);
    assert!(
        out.contains("refused:") && out.contains("ulimit -n"),
        "{out}"
    );
    assert!(out.contains("VERIFY Err(TooManyFiles"), "{out}");
}

#[test]
fn a_fifo_as_tensor_file_or_manifest_is_an_error_not_a_hang() {
    let (_tmp, dir, manifest) = temp_store(1, 2);
    let file = dir.join(manifest.tensors()[1].file());
    std::fs::remove_file(&file).unwrap();
    mkfifo(&file);
    let err = on_dir_in_time(&dir, |d| MappedStore::open(d).unwrap_err());
    assert!(
        matches!(err, StoreError::Io { ref tensor, .. } if tensor == "t1"),
        "{err}"
    );
    let problems = on_dir_in_time(&dir, |d| burn_mapped::verify_dir(d, |_, _| {}).unwrap());
    assert_eq!(problems.len(), 1, "{problems:?}");

    std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
    mkfifo(&dir.join(MANIFEST_FILE));
    let err = on_dir_in_time(&dir, |d| Manifest::read(d).unwrap_err());
    assert!(matches!(err, StoreError::ManifestIo { .. }), "{err}");
}

#[test]
fn a_manifest_linked_to_an_endless_file_is_refused_without_reading_it() {
    let (_tmp, dir, _) = temp_store(1, 1);
    std::fs::remove_file(dir.join(MANIFEST_FILE)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join(MANIFEST_FILE)).unwrap();
    let err = on_dir_in_time(&dir, |d| Manifest::read(d).unwrap_err());
    assert!(matches!(err, StoreError::ManifestIo { .. }), "{err}");
}

#[test]
fn a_manifest_longer_than_the_cap_is_refused_by_the_bytes_read() {
    let (_tmp, dir, _) = temp_store(1, 1);
    let big = vec![b' '; (burn_mapped::manifest::MAX_MANIFEST_BYTES + 1) as usize];
    std::fs::write(dir.join(MANIFEST_FILE), big).unwrap();
    assert!(matches!(
        Manifest::read(&dir).unwrap_err(),
        StoreError::ManifestTooLarge { .. }
    ));
}

/// A manifest of three entries whose lengths add up past 2^64; the files are made sparse at
/// those sizes where the file system allows it (tmpfs does), so only the arithmetic stands
/// between the image builder and a `MAP_FIXED` outside its reservation.
#[test]
fn sizes_that_add_up_past_the_address_space_are_a_typed_error() {
    let tmp = tempfile::tempdir_in(shm_or_tmp()).unwrap();
    let dir = tmp.path();
    let len: u64 = 6 << 60;
    let entries: Vec<String> = (0..3)
        .map(|i| {
            let file = format!("{i:05}-t{i}.tensor");
            if let Ok(f) = std::fs::File::create(dir.join(&file)) {
                let _ = f.set_len(len);
            }
            format!(
                r#"{{"name":"t{i}","dtype":"u8","shape":[{len}],"file":"{file}","len":{len},"xxh3":"0000000000000000"}}"#
            )
        })
        .collect();
    let manifest = format!(
        r#"{{"format":"burn-mapped","version":2,"alignment":16384,"tensors":[{}]}}"#,
        entries.join(",")
    );
    std::fs::write(dir.join(MANIFEST_FILE), manifest).unwrap();
    let err = MappedRecorder::default().load(dir).unwrap_err();
    assert!(matches!(err, StoreError::StoreTooLarge { .. }), "{err}");
    let err = MappedStore::open(dir).unwrap_err();
    assert!(matches!(err, StoreError::StoreTooLarge { .. }), "{err}");
}

fn shm_or_tmp() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        shm
    } else {
        std::env::temp_dir()
    }
}

#[test]
fn verify_on_open_catches_a_changed_byte_that_a_plain_open_does_not() {
    let (_tmp, dir, manifest) = temp_store(1, 1);
    let file = dir.join(manifest.tensors()[0].file());
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    assert!(MappedStore::open(&dir).is_ok());
    let err = MappedStore::options().verify(true).open(&dir).unwrap_err();
    assert!(matches!(err, StoreError::ChecksumMismatch { .. }), "{err}");
}

/// Writers replace the store over and over while readers open it: every load sees one
/// generation whole (each tensor holds the byte its manifest's metadata names), and none
/// fails.
#[test]
fn readers_never_see_a_mix_of_generations_while_a_writer_replaces_the_store() {
    let (_tmp, dir, _) = temp_store(0, 4);
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut generation = 0u8;
            while !stop.load(Ordering::Relaxed) {
                generation = generation.wrapping_add(1);
                write_store(&dir, generation, 4);
            }
            generation
        })
    };
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut loads = 0;
    while Instant::now() < deadline {
        let store = MappedStore::open(&dir).unwrap();
        let fill: u8 = store.manifest().metadata()["fill"].parse().unwrap();
        for (entry, file) in store.iter() {
            assert!(
                file.bytes().iter().all(|&b| b == fill),
                "tensor {} mixes generations",
                entry.name()
            );
        }
        let record = MappedRecorder::default().load(&dir).unwrap();
        drop(record);
        loads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let generations = writer.join().unwrap();
    assert!(loads > 0 && generations > 0);
}

/// Truncating a mapped tensor file ends the process with [`SIGBUS_EXIT_CODE`] and a line
/// naming the file. The faulting process is this test binary started again, running only
/// this test with the child variable set.
#[test]
fn a_file_truncated_under_its_mapping_ends_the_process_naming_the_file() {
    const CHILD: &str = "BURN_MAPPED_SIGBUS_CHILD";
    if let Ok(dir) = std::env::var(CHILD) {
        let store = MappedStore::open(&dir).unwrap();
        let (_, file) = store.iter().next().unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(file.path())
            .unwrap()
            .set_len(0)
            .unwrap();
        let sum: u64 = file.bytes().iter().map(|&b| u64::from(b)).sum();
        panic!("read {sum} from a truncated mapping without a fault");
    }
    let (_tmp, dir, manifest) = temp_store(9, 1);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_file_truncated_under_its_mapping_ends_the_process_naming_the_file",
            "--nocapture",
        ])
        .env(CHILD, &dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(SIGBUS_EXIT_CODE), "{stderr}");
    assert!(
        stderr.contains("became unreadable while mapped"),
        "{stderr}"
    );
    let file = dir.join(manifest.tensors()[0].file());
    assert!(stderr.contains(&*file.to_string_lossy()), "{stderr}");
}

/// A GGUF truncated while it is being converted ends the process with [`SIGBUS_EXIT_CODE`], a
/// line naming the GGUF, and no temporary directory left beside the store. The converting
/// process is this test binary started again; its progress callback truncates the source
/// after the first tensor, as another program could.
#[test]
fn a_source_truncated_during_conversion_ends_the_process_and_leaves_nothing() {
    use burn_mapped::convert::ConvertOptions;
    use burn_mapped::gguf::{MappedGguf, gguf_to_store};
    use burn_mapped_tests::gguf::{Builder, F32};
    const CHILD: &str = "BURN_MAPPED_SOURCE_SIGBUS_CHILD";
    if let Ok(dir) = std::env::var(CHILD) {
        let dir = PathBuf::from(dir);
        let source = dir.join("model.gguf");
        let gguf = MappedGguf::open(&source).unwrap();
        let progress = |_: &burn_mapped::convert::Progress<'_>| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&source)
                .unwrap()
                .set_len(4096)
                .unwrap();
        };
        let result = gguf_to_store(
            &gguf,
            &dir.join("store"),
            ConvertOptions::default()
                .progress(progress)
                .existing(Existing::Refuse),
        );
        panic!("converted a truncated source without a fault: {result:?}");
    }
    let tmp = tempfile::tempdir().unwrap();
    let values: Vec<u8> = (0..1u32 << 18)
        .flat_map(|i| (i as f32).to_le_bytes())
        .collect();
    let bytes = Builder::new()
        .kv_str("general.architecture", "test")
        .tensor_data("a", &[1 << 18], F32, &values)
        .tensor_data("b", &[1 << 18], F32, &values)
        .build();
    let source = tmp.path().join("model.gguf");
    std::fs::write(&source, bytes).unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_source_truncated_during_conversion_ends_the_process_and_leaves_nothing",
            "--nocapture",
        ])
        .env(CHILD, tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(SIGBUS_EXIT_CODE), "{stderr}");
    assert!(stderr.contains("mapped input file"), "{stderr}");
    assert!(stderr.contains(&*source.to_string_lossy()), "{stderr}");
    let names = entry_names(tmp.path());
    assert_eq!(names, ["model.gguf"], "{names:?}");
}
