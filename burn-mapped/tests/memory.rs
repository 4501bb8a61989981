//! Adoption measured from outside: anonymous memory does not grow by the weights' size when a
//! large module is loaded (while Burn's copying loaders do, which shows the measurement can see
//! a copy), and two processes mapping one store share its pages.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use burn::module::Module;
use burn::nn::LinearLayout;
use burn::store::{ModuleSnapshot, SafetensorsStore};
use burn::tensor::{Device, Tensor};
use burn_mapped::host::memstat::{file_mappings, rss_self};
use burn_mapped::{MappedRecorder, MappedStore};
use burn_mapped_tests::synthetic::{BIG_DIM, BIG_WEIGHT_BYTES, BigStack, write_big_stack};
use burn_mapped_tests::tempdir;
use common::*;

/// Seed of the big store's values.
const SEED: u64 = 0x9E37_79B9_7F4A_7C15;

fn growth(out: &str, key: &str) -> f64 {
    child_value::<u64>(out, key) as f64 / BIG_WEIGHT_BYTES as f64
}

#[test]
fn loading_a_large_module_grows_anonymous_memory_by_under_two_percent() {
    let tmp = tempdir();
    let store = tmp.path().join("store");
    write_big_stack(&store, SEED);
    // Burn's own formats, from the same weights, for the copying controls.
    let bpk = tmp.path().join("big.bpk");
    let st = tmp.path().join("big.safetensors");
    {
        let mut module = BigStack::init(&Device::flex(), LinearLayout::Col);
        module
            .load_from(&mut MappedStore::open(&store).unwrap())
            .unwrap();
        module
            .save_into(&mut SafetensorsStore::from_file(&st))
            .unwrap();
        module.into_record().save(&bpk).unwrap();
    }
    let mut report = Vec::new();
    for arm in ["recorder", "store", "load_file", "safetensors"] {
        let out = run_child(
            "child_loads_big_module",
            &[
                ("BM_ARM", arm),
                ("BM_STORE", store.to_str().unwrap()),
                ("BM_BPK", bpk.to_str().unwrap()),
                ("BM_ST", st.to_str().unwrap()),
            ],
        );
        let load = growth(&out, "anon_load");
        let forward = growth(&out, "anon_forward");
        println!(
            "{arm:>12}: RssAnon +{:.3}% of weights after load, +{:.3}% after a forward pass; RssFile {} MiB",
            load * 100.0,
            forward * 100.0,
            child_value::<u64>(&out, "file") >> 20
        );
        report.push((arm, load, forward));
    }
    for (arm, load, forward) in report {
        match arm {
            "recorder" | "store" => {
                assert!(load < 0.02 && forward < 0.02, "{arm}: {load} / {forward}");
            }
            // The controls copy: if these did not grow, the measurement would be blind.
            _ => assert!(forward > 0.5, "{arm} should copy the weights: {forward}"),
        }
    }
}

#[test]
#[ignore = "child process of loading_a_large_module_grows_anonymous_memory_by_under_two_percent"]
fn child_loads_big_module() {
    let env = |k: &str| std::env::var(k).unwrap();
    let device = Device::flex();
    let before = rss_self().unwrap().anon;
    let module = BigStack::init(&device, LinearLayout::Col);
    let module = match env("BM_ARM").as_str() {
        "recorder" => module.load_record(MappedRecorder::default().load(env("BM_STORE")).unwrap()),
        "store" => {
            let mut module = module;
            module
                .load_from(&mut MappedStore::open(env("BM_STORE")).unwrap())
                .unwrap();
            module
        }
        "load_file" => module.load_file(env("BM_BPK")),
        "safetensors" => {
            let mut module = module;
            module
                .load_from(&mut SafetensorsStore::from_file(env("BM_ST")))
                .unwrap();
            module
        }
        other => panic!("unknown arm {other}"),
    };
    let after_load = rss_self().unwrap().anon;
    let y = module
        .forward(Tensor::ones([1, BIG_DIM], &device))
        .into_data();
    assert!(y.iter::<f32>().all(f32::is_finite));
    let rss = rss_self().unwrap();
    println!("anon_load={}", after_load.saturating_sub(before));
    println!("anon_forward={}", rss.anon.saturating_sub(before));
    println!("file={}", rss.file);
}

#[test]
fn two_processes_mapping_one_store_share_its_pages() {
    let (_tmp, dir, _) = recorded_net();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "child_maps_and_waits",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("BM_STORE", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let pid = loop {
        let line = lines.next().expect("child exited early").unwrap();
        if let Some(pid) = line
            .split_whitespace()
            .find_map(|t| t.strip_prefix("ready="))
        {
            break pid.to_string();
        }
    };
    let store = MappedStore::open(&dir).unwrap();
    assert!(store.verify().is_empty()); // touches every page here too
    let (entry, _) = store
        .iter()
        .find(|(e, _)| e.name() == "embed.weight")
        .unwrap();
    let file = dir.join(entry.file());
    let padded = entry.padded_len();
    for who in [pid.as_str(), "self"] {
        let maps = file_mappings(who, &file).unwrap();
        let shared: u64 = maps.iter().map(|m| m.shared_clean).sum();
        let dirty: u64 = maps.iter().map(|m| m.dirty).sum();
        assert!(maps.iter().all(|m| m.perms == "r--s"), "{who}: {maps:?}");
        assert!(
            shared >= padded * 9 / 10,
            "{who}: Shared_Clean {shared} of {padded}"
        );
        assert_eq!(dirty, 0, "{who}: mapped pages must stay clean");
    }
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
#[ignore = "child process of two_processes_mapping_one_store_share_its_pages"]
fn child_maps_and_waits() {
    let store = MappedStore::open(std::env::var("BM_STORE").unwrap()).unwrap();
    assert!(store.verify().is_empty());
    println!("ready={}", std::process::id());
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    drop(store);
}

/// Read-ahead brings a store dropped from the page cache back without the program reading
/// it, except the tensor it is told to skip, takes no anonymous memory, and leaves the pages
/// mapped huge wherever the program's own faults would.
///
/// In a child process of its own, so that the other tests' allocations do not count.
#[test]
fn read_ahead_brings_back_every_tensor_but_the_skipped_one() {
    let tmp = tempdir();
    let dir = tmp.path().join("store");
    write_big_stack(&dir, SEED);
    let out = run_child("child_reads_ahead", &[("BM_STORE", dir.to_str().unwrap())]);
    println!("{out}");
}

#[test]
#[ignore = "child process of read_ahead_brings_back_every_tensor_but_the_skipped_one"]
fn child_reads_ahead() {
    use burn_mapped::host::memstat::{evict, residency};
    let dir = std::path::PathBuf::from(std::env::var("BM_STORE").unwrap());
    let store = MappedStore::open(&dir).unwrap();
    let names: Vec<String> = store
        .manifest()
        .tensors()
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    let skipped = names[names.len() / 2].as_str();
    for t in store.manifest().tensors() {
        let path = dir.join(t.file());
        // Fresh files are dirty; the kernel drops clean pages only.
        std::fs::File::open(&path).unwrap().sync_all().unwrap();
        evict(&path).unwrap();
    }
    let resident = |name: &str| residency(store.bytes(name).unwrap()).unwrap();
    let dropped = names.iter().all(|n| resident(n) < 0.5);
    let anon = rss_self().unwrap().anon;
    let asked = store.read_ahead(&[skipped]);
    let expected: u64 = store
        .manifest()
        .tensors()
        .iter()
        .filter(|t| t.name() != skipped)
        .map(|t| t.len())
        .sum();
    assert_eq!(asked, expected, "bytes asked for");
    if !dropped {
        // A file system whose pages cannot be dropped (tmpfs): nothing to bring back.
        println!("the store stayed cached; residency not checked");
        return;
    }
    let start = std::time::Instant::now();
    let others = || names.iter().filter(|n| n.as_str() != skipped);
    while others().any(|n| resident(n) < 1.0) {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "after 60 s: {:?}",
            others().map(|n| resident(n)).collect::<Vec<_>>()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(
        resident(skipped) < 0.5,
        "the skipped tensor was read: {}",
        resident(skipped)
    );
    let grown = rss_self().unwrap().anon.saturating_sub(anon);
    assert!(
        grown < BIG_WEIGHT_BYTES / 50,
        "anonymous memory grew by {grown}"
    );
    // Read ahead as the model's own reads would be: where a fault maps this file system's
    // pages huge (the control: the skipped tensor, touched a page at a time), the tensors
    // read ahead are mapped huge too, not left in 4 KiB pages for every later process.
    let huge = |name: &str| -> u64 {
        let path = dir.join(store.manifest().get(name).unwrap().file());
        file_mappings("self", &path)
            .unwrap()
            .iter()
            .map(|m| m.file_pmd_mapped)
            .sum()
    };
    let page = burn_mapped::host::page_size();
    let bytes = store.bytes(skipped).unwrap();
    let touched: u64 = (0..bytes.len())
        .step_by(page)
        .map(|i| u64::from(std::hint::black_box(bytes[i])))
        .sum();
    std::hint::black_box(touched);
    if huge(skipped) == 0 {
        println!("faults map this file system's pages 4 KiB at a time; huge pages not checked");
        return;
    }
    let read_ahead_huge: u64 = others().map(|n| huge(n)).sum();
    assert!(
        read_ahead_huge >= expected / 2,
        "{read_ahead_huge} of {expected} bytes read ahead are mapped huge, where a fault maps \
         the control's {} of {}",
        huge(skipped),
        bytes.len()
    );
}
