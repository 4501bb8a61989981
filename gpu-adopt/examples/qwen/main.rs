//! Greedy Qwen2.5 decoding on a GPU device from a store, with the weights adopted (`map`) or
//! copied into device memory (`resident`), and what each placement costs: model-ready time,
//! decode rate, anonymous memory. `both` (the default) runs map then resident in one process
//! and checks that they choose the same tokens with bitwise-equal logits.
//!
//! ```sh
//! cargo run --release --example qwen -- STORE_DIR [--placement map|resident|both]
//!     [--tokens N] [--prompt-ids 750,75698,1445,1648]
//! ```
//!
//! The store is one `burn-mapped convert` wrote from the GGUF (its config is in the manifest),
//! for example `~/.cache/burn-mapped/stores/qwen2.5-coder-0.5b-instruct-q4_k_m-<hash>-q8`. Token ids in
//! and out (the default prompt is "def fibonacci(n):"); the root workspace's `burn-mapped
//! generate` has the tokenizer. Prints one JSON line per placement, then a table.

mod load;

use std::time::Instant;

use burn_mapped::MappedStore;
use burn_mapped::host::memstat::rss_self;
use burn_mapped_gpu::GpuDevice;
use serde_json::json;

const USAGE: &str =
    "usage: qwen STORE_DIR [--placement map|resident|both] [--tokens N] [--prompt-ids a,b,...]";

struct Run {
    placement: &'static str,
    tokens: Vec<u32>,
    rows: Vec<Vec<f32>>,
    json: serde_json::Value,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut dir = None;
    let mut placements = vec!["map", "resident"];
    let mut steps = 16usize;
    let mut prompt = vec![750u32, 75698, 1445, 1648];
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(USAGE);
        match arg.as_str() {
            "--placement" => {
                placements = match value()?.as_str() {
                    "map" => vec!["map"],
                    "resident" => vec!["resident"],
                    "both" => vec!["map", "resident"],
                    _ => return Err(USAGE.into()),
                }
            }
            "--tokens" => steps = value()?.parse::<usize>()?.max(1) - 1,
            "--prompt-ids" => {
                prompt = value()?
                    .split(',')
                    .map(|t| t.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ if dir.is_none() && !arg.starts_with('-') => dir = Some(arg),
            _ => return Err(USAGE.into()),
        }
    }
    let dir = dir.ok_or(USAGE)?;
    if prompt.is_empty() {
        return Err("--prompt-ids is empty".into());
    }
    let gpu = GpuDevice::open()?;
    eprintln!(
        "adapter: {}; host import: {}; max binding {} bytes",
        gpu.adapter_name(),
        match gpu.host_import() {
            Ok(()) => "available".to_string(),
            Err(reason) => format!("unavailable ({reason})"),
        },
        gpu.max_binding()
    );
    let store = MappedStore::open(&dir)?;
    let weights: u64 = store.manifest().tensors().iter().map(|t| t.len()).sum();
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;

    let mut runs = Vec::new();
    for placement in placements {
        let anon0 = rss_self()?.anon;
        let start = Instant::now();
        let loaded = load::load_qwen(&gpu, &store, placement == "map")?;
        let ready = start.elapsed().as_secs_f64();
        let at_load = rss_self()?.anon.saturating_sub(anon0);
        let start = Instant::now();
        let (tokens, rows, rate) = load::greedy(&loaded.model, &prompt, steps, gpu.device());
        let total = start.elapsed().as_secs_f64();
        let at_decode = rss_self()?.anon.saturating_sub(anon0);
        let (mapped, resident) = loaded.bytes(&store);
        let json = json!({
            "placement": placement,
            "adapter": gpu.adapter_name(),
            "store": dir,
            "weights_bytes": weights,
            "mapped_bytes": mapped,
            "resident_bytes": resident,
            "vocab_block_rows": loaded.block_rows,
            "vocab_blocks": loaded.blocks.len(),
            "model_ready_s": ready,
            "prefill_and_decode_s": total,
            "decode_tok_s": if steps > 0 { Some(rate) } else { None },
            "rss_anon_growth_after_load": at_load,
            "rss_anon_growth_after_decode": at_decode,
            "prompt_ids": prompt,
            "tokens": tokens,
        });
        println!("{json}");
        runs.push(Run {
            placement,
            tokens,
            rows,
            json,
        });
        drop(loaded);
        gpu.cleanup();
    }

    println!();
    println!(
        "| placement | model-ready | decode tok/s | RssAnon + at load | + after decode | mapped | resident |"
    );
    println!("|---|---|---|---|---|---|---|");
    for run in &runs {
        let j = &run.json;
        let get = |k: &str| j[k].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | {:.2} s | {:.3} | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            run.placement,
            get("model_ready_s"),
            get("decode_tok_s"),
            mib(get("rss_anon_growth_after_load") as u64),
            mib(get("rss_anon_growth_after_decode") as u64),
            mib(get("mapped_bytes") as u64),
            mib(get("resident_bytes") as u64),
        );
    }
    println!("tokens ({}): {:?}", runs[0].placement, runs[0].tokens);
    if let [map, resident] = &runs[..] {
        let same_tokens = map.tokens == resident.tokens;
        let same_logits = map.rows == resident.rows;
        println!("map vs resident: same tokens {same_tokens}, bitwise-equal logits {same_logits}");
        if !same_tokens {
            return Err("map and resident chose different tokens".into());
        }
    }
    Ok(())
}
