//! The auto placement's probe cache: a hit reuses the probe, a different key (store bytes,
//! protocol) misses, an old entry expires, a damaged one is replaced. Time is passed in, so
//! nothing here depends on how long anything takes.

mod common;

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use burn::tensor::DType;
use burn_mapped::{Placement, StoreWriter, TensorSpec};
use burn_mapped_tests::synthetic::edit_manifest;
use burn_mapped_tools::auto::{AutoOptions, PlacementChoice, ProbeOrigin, decide};
use burn_mapped_tools::device::DeviceArg;
use burn_mapped_tools::probe::{CpuProbeConfig, probe_cpu, tensor_files_in};
use burn_mapped_tools::probe_cache::{Lookup, ProbeCache, ProbeKey, store_fingerprint};
use common::{scratch, small_probe_config};

fn write(dir: &Path, name: &str, len: usize, seed: u8) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join(name);
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    File::create(&path).unwrap().write_all(&bytes).unwrap();
    path
}

fn small_config() -> CpuProbeConfig {
    CpuProbeConfig {
        memory_margin_bytes: 0,
        ..small_probe_config(2)
    }
}

fn options(cache_dir: &Path, max_age: Duration) -> AutoOptions {
    AutoOptions {
        cache: Some(ProbeCache::new(cache_dir, max_age)),
        refresh: false,
        theta: 0.05,
        cpu: small_config(),
    }
}

const T0: Duration = Duration::from_secs(1_800_000_000);

fn at(offset_s: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + T0 + Duration::from_secs(offset_s)
}

#[test]
fn a_second_decision_reuses_the_cached_probe_until_it_expires() {
    let tmp = scratch();
    let store = tmp.path().join("store");
    write(&store, "a.tensor", 3 << 20, 1);
    write(&store, "b.tensor", 1 << 20, 2);
    let cache_dir = tmp.path().join("probes");
    let opts = options(&cache_dir, Duration::from_secs(3600));

    let first = decide(&store, DeviceArg::Cpu, &opts, at(0)).unwrap();
    let ProbeOrigin::Fresh { cached_at, .. } = &first.origin else {
        panic!("an empty cache must probe: {:?}", first.origin);
    };
    let entry = cached_at.clone().expect("the probe is cached");
    assert!(entry.starts_with(&cache_dir));
    assert_eq!(first.placement, first.verdict.chosen);

    // Within max_age: the same report, not a new probe.
    let second = decide(&store, DeviceArg::Cpu, &opts, at(3600)).unwrap();
    match &second.origin {
        ProbeOrigin::Cached { age_seconds, path } => {
            assert_eq!(*age_seconds, 3600.0);
            assert_eq!(path, &entry);
        }
        other => panic!("expected a cache hit, got {other:?}"),
    }
    assert_eq!(second.report, first.report);
    assert_eq!(second.verdict, first.verdict);

    // One second past max_age: probed again and re-cached.
    let third = decide(&store, DeviceArg::Cpu, &opts, at(3601)).unwrap();
    match &third.origin {
        ProbeOrigin::Fresh { cache, .. } => assert!(cache.contains("expired"), "{cache}"),
        other => panic!("expected an expired entry, got {other:?}"),
    }
    let fourth = decide(&store, DeviceArg::Cpu, &opts, at(3602)).unwrap();
    assert!(matches!(fourth.origin, ProbeOrigin::Cached { .. }));
}

#[test]
fn changed_store_bytes_or_protocol_change_the_key() {
    let tmp = scratch();
    let store = tmp.path().join("store");
    let mut writer = StoreWriter::create(&store).unwrap();
    writer
        .add(
            TensorSpec::new("w", DType::U8, [1 << 20]),
            &vec![1u8; 1 << 20],
        )
        .unwrap();
    writer.finish().unwrap();
    let files = tensor_files_in(&store).unwrap();
    assert_eq!(files.len(), 1, "the manifest is not part of W");
    let name = files[0].file_name().unwrap().to_str().unwrap().to_string();
    let config = small_config();
    let key = ProbeKey::cpu(&files, &config).unwrap();

    // Same files, same manifest: same key.
    assert_eq!(ProbeKey::cpu(&files, &config).unwrap(), key);
    // A manifest edit (its xxh3 entries follow the tensor bytes) changes the store fingerprint.
    edit_manifest(&store, |v| {
        v["metadata"] = serde_json::json!({"edited": "yes"})
    });
    let edited = ProbeKey::cpu(&files, &config).unwrap();
    assert_ne!(edited.store, key.store);
    assert_eq!(edited.device, key.device);
    // A longer file changes it too.
    write(&store, &name, (1 << 20) + 4096, 1);
    assert_ne!(store_fingerprint(&files).unwrap(), edited.store);
    // A different protocol is a different probe.
    let more_passes = CpuProbeConfig {
        passes: 3,
        ..config.clone()
    };
    let other = ProbeKey::cpu(&files, &more_passes).unwrap();
    assert_ne!(other.protocol, edited.protocol);

    // The cache keys entries by all of it.
    let cache = ProbeCache::new(tmp.path().join("probes"), Duration::from_secs(60));
    assert_ne!(cache.path_for(&key), cache.path_for(&other));
    let report = probe_cpu(&files, &config).unwrap();
    cache.put(&key, &report, at(0)).unwrap();
    assert!(matches!(
        cache.get(&key, at(1)).unwrap(),
        Lookup::Hit { .. }
    ));
    assert_eq!(cache.get(&other, at(1)).unwrap(), Lookup::Miss);
}

#[test]
fn damaged_future_and_foreign_entries_are_not_trusted() {
    let tmp = scratch();
    let store = tmp.path().join("store");
    let files = vec![write(&store, "x.tensor", 256 << 10, 3)];
    let config = small_config();
    let key = ProbeKey::cpu(&files, &config).unwrap();
    let cache = ProbeCache::new(tmp.path().join("probes"), Duration::from_secs(60));
    let report = probe_cpu(&files, &config).unwrap();

    // Dated after `now`: treated as expired.
    cache.put(&key, &report, at(100)).unwrap();
    assert!(matches!(
        cache.get(&key, at(50)).unwrap(),
        Lookup::Expired { .. }
    ));

    // An entry written for another key under this key's file name.
    let foreign = ProbeKey {
        device: "another machine".to_owned(),
        ..key.clone()
    };
    cache.put(&foreign, &report, at(0)).unwrap();
    std::fs::rename(cache.path_for(&foreign), cache.path_for(&key)).unwrap();
    assert!(matches!(
        cache.get(&key, at(1)).unwrap(),
        Lookup::Invalid { .. }
    ));

    // Damaged JSON, then a decision that replaces it.
    std::fs::write(cache.path_for(&key), b"{ not json").unwrap();
    assert!(matches!(
        cache.get(&key, at(1)).unwrap(),
        Lookup::Invalid { .. }
    ));
    let opts = AutoOptions {
        cache: Some(cache.clone()),
        refresh: false,
        theta: 0.05,
        cpu: config,
    };
    let decision = decide(&store, DeviceArg::Cpu, &opts, at(2)).unwrap();
    assert!(matches!(decision.origin, ProbeOrigin::Fresh { .. }));
    assert!(matches!(
        cache.get(&key, at(3)).unwrap(),
        Lookup::Hit { .. }
    ));
}

#[test]
fn refresh_and_no_cache_always_probe() {
    let tmp = scratch();
    let store = tmp.path().join("store");
    write(&store, "x.tensor", 512 << 10, 4);
    let mut opts = options(&tmp.path().join("probes"), Duration::from_secs(60));
    decide(&store, DeviceArg::Cpu, &opts, at(0)).unwrap();
    opts.refresh = true;
    let refreshed = decide(&store, DeviceArg::Cpu, &opts, at(1)).unwrap();
    assert!(matches!(refreshed.origin, ProbeOrigin::Fresh { .. }));
    opts.cache = None;
    let uncached = decide(&store, DeviceArg::Cpu, &opts, at(2)).unwrap();
    match uncached.origin {
        ProbeOrigin::Fresh { cached_at, .. } => assert_eq!(cached_at, None),
        other => panic!("{other:?}"),
    }
}

#[test]
fn placement_choice_names_round_trip() {
    let fixed = Placement::ALL.map(PlacementChoice::Fixed);
    for choice in [PlacementChoice::Auto].into_iter().chain(fixed) {
        assert_eq!(choice.name().parse::<PlacementChoice>(), Ok(choice));
    }
    assert_eq!(PlacementChoice::default(), PlacementChoice::Auto);
    assert_eq!(PlacementChoice::Auto.fixed(), None);
    assert_eq!(
        PlacementChoice::Fixed(Placement::Resident).fixed(),
        Some(Placement::Resident)
    );
    let err = "streaming".parse::<PlacementChoice>().unwrap_err();
    assert!(err.to_string().ends_with("or auto"), "{err}");
}

/// An entry that parses but that the rule refuses (every rate zero) costs a fresh probe and a
/// warning, not every later run.
#[test]
fn a_damaged_entry_that_parses_means_probe_again_and_warn() {
    let tmp = scratch();
    let store = tmp.path().join("store");
    write(&store, "a.tensor", 1 << 20, 1);
    let opts = options(&tmp.path().join("probes"), Duration::from_secs(3600));
    let first = decide(&store, DeviceArg::Cpu, &opts, at(0)).unwrap();
    let ProbeOrigin::Fresh {
        cached_at: Some(path),
        ..
    } = &first.origin
    else {
        panic!(
            "first decision was not probed and cached: {:?}",
            first.origin
        );
    };
    let text = std::fs::read_to_string(path).unwrap();
    let mut entry: serde_json::Value = serde_json::from_str(&text).unwrap();
    zero_rates(&mut entry);
    std::fs::write(path, serde_json::to_vec(&entry).unwrap()).unwrap();
    let second = decide(&store, DeviceArg::Cpu, &opts, at(1)).unwrap();
    assert!(
        matches!(second.origin, ProbeOrigin::Fresh { .. }),
        "{:?}",
        second.origin
    );
    assert!(
        second
            .warning
            .as_deref()
            .is_some_and(|w| w.contains("damaged")),
        "{:?}",
        second.warning
    );
}

fn zero_rates(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if key == "gbps" {
                    *v = serde_json::json!(0.0);
                } else {
                    zero_rates(v);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(zero_rates),
        _ => {}
    }
}

/// A cache directory that cannot be created costs the cache, not the decision.
#[test]
fn an_unwritable_cache_means_probe_without_caching_and_warn() {
    let tmp = scratch();
    let store = tmp.path().join("store");
    write(&store, "a.tensor", 1 << 20, 2);
    // A file where the cache directory should be: nothing can be created under it.
    let blocker = write(tmp.path(), "not-a-dir", 1, 0);
    let opts = options(&blocker.join("probes"), Duration::from_secs(3600));
    let decision = decide(&store, DeviceArg::Cpu, &opts, at(0)).unwrap();
    assert!(
        matches!(
            decision.origin,
            ProbeOrigin::Fresh {
                cached_at: None,
                ..
            }
        ),
        "{:?}",
        decision.origin
    );
    assert!(decision.warning.is_some());
}

#[test]
fn pass_counts_past_the_limit_are_a_typed_error_not_a_panic() {
    let tmp = scratch();
    let file = write(tmp.path(), "a.tensor", 1 << 16, 3);
    for (warmup, passes) in [(1, usize::MAX), (usize::MAX, 1), (0, 1), (1, 0)] {
        let config = CpuProbeConfig {
            warmup_passes: warmup,
            passes,
            ..small_config()
        };
        let err = probe_cpu(std::slice::from_ref(&file), &config).unwrap_err();
        assert!(
            matches!(err, burn_mapped_tools::probe::ProbeError::Config { .. }),
            "{err}"
        );
    }
}
