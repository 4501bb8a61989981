//! Compiled GPU kernels kept from one process to the next.
//!
//! A new process on the `vulkan` device would otherwise compile every kernel it launches
//! (CubeCL's IR to SPIR-V), most of its wait for the first token. CubeCL keeps compiled SPIR-V
//! in an on-disk store when Burn is built with `persistence`; [`KernelCache::enable`] turns that
//! store on in a directory before the GPU runtime starts (`<cache-dir>/kernels` on `generate
//! --device vulkan`, or `--kernel-cache DIR`): on an H100 it halved a new process's wait for its
//! first token (docs/GPU.md). An entry is found only by
//! the same GPU (vendor and device id), the same reported properties and features, and the same
//! binary (its build id), so another GPU, driver feature set or build compiles afresh. The
//! driver's version is not part of the key: SPIR-V is what the driver compiles, not its
//! output, and the driver caches its own pipelines under its own key.
//!
//! A store that cannot be read is never fatal: a file that is not a database at all is moved
//! aside before the runtime opens it; one the runtime fails to open, or an entry it cannot
//! decode, is reported on stderr and moved aside when the command ends, so the next process
//! starts a new one. Either way this process compiles what it needs.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde::Serialize;

/// The store's file inside the kernel cache directory: CubeCL's default environment.
const STORE_FILE: &str = "default.db";

/// What every SQLite-format database file starts with (CubeCL's store is one).
const DB_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// The kernel cache of this process, as `--json` reports it.
#[derive(Debug, Clone, Serialize)]
pub struct KernelCacheReport {
    /// The directory holding the store.
    pub dir: PathBuf,
    /// Kernels compiled by this process (each stored for the next one).
    pub compiled: usize,
    /// Kernels read from the store instead of compiled.
    pub loaded: usize,
    /// Why the store was set aside, where it was.
    pub reset: Option<String>,
}

/// The kernel cache of this process, enabled by [`KernelCache::enable`].
#[derive(Debug)]
pub struct KernelCache {
    dir: PathBuf,
    reset: Option<String>,
}

impl KernelCache {
    /// Turns CubeCL's compilation store on at `dir` for this process, before any GPU runtime
    /// starts. Returns `None` (saying why on stderr) where the store cannot serve: a build
    /// without the SPIR-V compiler (`vulkan`), or a CubeCL configuration already in use.
    pub fn enable(dir: &Path) -> Option<Self> {
        if !cfg!(feature = "vulkan") {
            tell!(
                "warning: kernel cache off: only the `vulkan` build compiles kernels to SPIR-V, \
                 which the cache keeps"
            );
            return None;
        }
        let reset = set_aside_if_damaged(dir);
        if let Some(why) = &reset {
            tell!(
                "warning: kernel cache {}: {why}; moved aside, starting a new one",
                dir.join(STORE_FILE).display()
            );
        }
        if let Err(e) = std::fs::create_dir_all(dir) {
            tell!(
                "warning: kernel cache {} cannot be created ({e}); compiling every kernel",
                dir.display()
            );
            return None;
        }
        if !configure_cubecl(dir) {
            tell!("warning: kernel cache off: CubeCL's configuration was read before it was set");
            return None;
        }
        watch_runtime_log();
        Some(Self {
            dir: dir.to_path_buf(),
            reset,
        })
    }

    /// What this process compiled and loaded so far. A store the runtime could not read is
    /// moved aside now (it would fail every later process the same way).
    pub fn finish(self) -> KernelCacheReport {
        let failed = WATCH.failed.lock().map(|f| f.clone()).unwrap_or_default();
        let reset = match failed {
            Some(why) => {
                if let Err(e) = set_aside(&self.dir) {
                    tell!("warning: kernel cache {}: {e}", self.dir.display());
                } else {
                    tell!(
                        "warning: kernel cache {} could not be read ({why}); moved aside, the \
                         next process starts a new one",
                        self.dir.join(STORE_FILE).display()
                    );
                }
                Some(why)
            }
            None => self.reset,
        };
        KernelCacheReport {
            dir: self.dir,
            compiled: WATCH.compiled.load(Ordering::Relaxed),
            loaded: WATCH.loaded.load(Ordering::Relaxed),
            reset,
        }
    }
}

/// Sets CubeCL's runtime configuration: the user's own (`cubecl.toml`, `CUBECL_*`), with the
/// compilation store on at `dir` and build records off (they would add a write per compile
/// that nothing here reads). `false` if CubeCL had already read its configuration.
#[cfg(feature = "vulkan")]
fn configure_cubecl(dir: &Path) -> bool {
    use burn_cubecl::cubecl::config::cache::CacheConfig;
    use burn_cubecl::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    use burn_cubecl::cubecl::records::RecordLevel;

    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config.compilation.cache = true;
    config.environment.path = CacheConfig::Directory(dir.to_path_buf());
    config.environment.records.level = RecordLevel::Off;
    CubeClRuntimeConfig::try_set(config)
}

#[cfg(not(feature = "vulkan"))]
fn configure_cubecl(_dir: &Path) -> bool {
    false
}

/// Why the store at `dir` is not a database, if it is not (checked before the runtime opens
/// it); such a store is renamed aside. A missing store is not damaged.
fn set_aside_if_damaged(dir: &Path) -> Option<String> {
    let why = damage(&dir.join(STORE_FILE))?;
    match set_aside(dir) {
        Ok(()) => Some(why),
        Err(e) => {
            tell!("warning: kernel cache {}: {e}", dir.display());
            None
        }
    }
}

/// What is wrong with the database file at `path`: unreadable, too short for a header, or
/// not starting with the SQLite header. `None` for a file that looks whole, or none at all.
fn damage(path: &Path) -> Option<String> {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => return Some(format!("unreadable ({e})")),
    };
    let mut head = [0u8; 16];
    match file.read_exact(&mut head) {
        // An empty file is what a process killed before its first write leaves.
        Err(_) if file.metadata().is_ok_and(|m| m.len() == 0) => None,
        Err(e) => Some(format!("unreadable header ({e})")),
        Ok(()) if &head != DB_MAGIC => Some("not a database".to_owned()),
        Ok(()) => None,
    }
}

/// Renames the store and its journal files to `*.damaged` (replacing earlier ones), so the
/// next open starts a new store and the old one is kept to look at.
fn set_aside(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.starts_with(STORE_FILE) && !name.ends_with(".damaged") {
            std::fs::rename(entry.path(), dir.join(format!("{name}.damaged")))?;
        }
    }
    Ok(())
}

/// What the runtime's log says about the store: kernels compiled, kernels loaded, and the
/// first failure to read it.
struct Watch {
    compiled: AtomicUsize,
    loaded: AtomicUsize,
    failed: Mutex<Option<String>>,
}

static WATCH: Watch = Watch {
    compiled: AtomicUsize::new(0),
    loaded: AtomicUsize::new(0),
    failed: Mutex::new(None),
};

/// The runtime's log target where it compiles a kernel for Vulkan (`Compiling <kernel>`).
const COMPILE_TARGET: &str = "cubecl_wgpu::backend::vulkan";
/// Where it loads one from the store (`Using SPIR-V cache`).
const LOAD_TARGET: &str = "cubecl_wgpu::backend::base";
/// Where the store reports what it could not read or write.
const STORE_TARGET: &str = "cubecl_environment::persistence";

impl Watch {
    /// Counts or reports one record; anything else is ignored (and never formatted).
    fn see(&self, level: log::Level, target: &str, message: &std::fmt::Arguments<'_>) {
        use log::Level::{Debug, Trace};
        match (level, target) {
            (Debug, COMPILE_TARGET) if message.to_string().starts_with("Compiling ") => {
                self.compiled.fetch_add(1, Ordering::Relaxed);
            }
            (Trace, LOAD_TARGET) if message.to_string() == "Using SPIR-V cache" => {
                self.loaded.fetch_add(1, Ordering::Relaxed);
            }
            (level, target) if level <= log::Level::Warn && target.starts_with(STORE_TARGET) => {
                let text = message.to_string();
                tell!("warning: kernel cache: {text}");
                // A store that cannot be opened, or holds an entry that cannot be decoded, is
                // set aside at the end; a refused write (a busy lock, a full disk) is not
                // damage.
                let damaged =
                    text.contains("Unable to open") || text.contains("Corrupted cache entry");
                if let (true, Ok(mut failed)) = (damaged, self.failed.lock()) {
                    failed.get_or_insert(text);
                }
            }
            _ => {}
        }
    }
}

struct WatchLogger;

impl log::Log for WatchLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.target().starts_with("cubecl_")
    }

    fn log(&self, record: &log::Record<'_>) {
        WATCH.see(record.level(), record.target(), record.args());
    }

    fn flush(&self) {}
}

/// Installs [`WatchLogger`] as the process's logger, unless one is installed already (then
/// the counts stay at zero).
fn watch_runtime_log() {
    static LOGGER: WatchLogger = WatchLogger;
    if log::set_logger(&LOGGER).is_ok() {
        // The load is logged at trace level; records of other crates stop at the target test.
        log::set_max_level(log::LevelFilter::Trace);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_is_not_a_database_is_damage_and_a_missing_or_empty_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(STORE_FILE);
        assert_eq!(damage(&path), None, "missing");
        std::fs::write(&path, b"").unwrap();
        assert_eq!(damage(&path), None, "empty");
        std::fs::write(&path, b"SQLite").unwrap();
        assert!(damage(&path).unwrap().contains("unreadable header"));
        std::fs::write(&path, [0xA5u8; 4096]).unwrap();
        assert_eq!(damage(&path).as_deref(), Some("not a database"));
        let mut whole = DB_MAGIC.to_vec();
        whole.resize(4096, 0);
        std::fs::write(&path, whole).unwrap();
        assert_eq!(damage(&path), None, "a database header");
    }

    #[test]
    fn a_damaged_store_is_renamed_with_its_journal_and_nothing_else_moves() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join(STORE_FILE), [0u8; 512]).unwrap();
        std::fs::write(d.join("default.db-wal"), b"journal").unwrap();
        std::fs::write(d.join("other.db"), b"keep").unwrap();
        assert_eq!(set_aside_if_damaged(d).as_deref(), Some("not a database"));
        let mut names: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            ["default.db-wal.damaged", "default.db.damaged", "other.db"]
        );
        assert_eq!(set_aside_if_damaged(d), None, "nothing left to set aside");
    }

    #[test]
    fn the_watch_counts_compiles_and_loads_and_keeps_the_first_read_failure() {
        let watch = Watch {
            compiled: AtomicUsize::new(0),
            loaded: AtomicUsize::new(0),
            failed: Mutex::new(None),
        };
        use log::Level::{Debug, Trace, Warn};
        let turso = "cubecl_environment::persistence::turso";
        let seen = |events: &[(log::Level, &str, &str)]| {
            for (level, target, text) in events {
                watch.see(*level, target, &format_args!("{text}"));
            }
        };
        seen(&[
            (Debug, COMPILE_TARGET, "Compiling gemv"),
            (Debug, COMPILE_TARGET, "Supported Vulkan features"),
            (Trace, LOAD_TARGET, "Using SPIR-V cache"),
            (Trace, "wgpu_core::device", "Using SPIR-V cache"),
            (Warn, turso, "Unable to write the store: database is locked"),
        ]);
        assert!(
            watch.failed.lock().unwrap().is_none(),
            "a busy store is not damage"
        );
        seen(&[
            (
                Warn,
                turso,
                "Unable to open the Turso cache: file is not a database",
            ),
            (
                Warn,
                "cubecl_environment::persistence::store",
                "Corrupted cache entry, ignoring it: bad tag",
            ),
        ]);
        assert_eq!(watch.compiled.load(Ordering::Relaxed), 1);
        assert_eq!(watch.loaded.load(Ordering::Relaxed), 1);
        assert_eq!(
            watch.failed.lock().unwrap().as_deref(),
            Some("Unable to open the Turso cache: file is not a database")
        );
    }
}
