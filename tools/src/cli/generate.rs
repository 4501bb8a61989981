//! `burn-mapped generate`: the main job. Fetches and converts on first use, loads Qwen2.5 with
//! every weight adopted from the mapped store, streams tokens, and reports how fast and how
//! small that was.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use burn_mapped::convert::Progress;
use burn_mapped::convert::WeightFormat;
use burn_mapped::host::memstat::rss_self;
use burn_mapped_models::qwen2::load::load;
use burn_mapped_models::qwen2::{Sampler, Sampling, SamplingError};
use burn_mapped_models::tokenizer::{Qwen2Tokenizer, chat_prompt};
use serde::Serialize;

use crate::auto::Decision;
use crate::device::DeviceArg;
use crate::fetch::default_cache_dir;
use crate::kernel_cache::{KernelCache, KernelCacheReport};
use crate::qwen;

use super::placement_args::PlacementArgs;

/// Arguments of `burn-mapped generate`.
#[derive(clap::Args, Debug)]
pub struct GenerateArgs {
    /// A known model name, a `.gguf` file, or a store directory.
    #[arg(long, default_value = qwen::QWEN25_CODER_05B)]
    pub model: String,
    /// The prompt.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template (Instruct models).
    #[arg(long)]
    pub chat: bool,
    /// System prompt for `--chat` (default: the template's own).
    #[arg(long)]
    pub system: Option<String>,
    /// Most new tokens to generate; generation stops earlier at the model's end-of-turn
    /// token. The prompt plus this must fit the model's context length.
    #[arg(long, default_value_t = 1024)]
    pub max_tokens: usize,
    /// Generate all --max-tokens tokens, past end-of-turn tokens too (for timing runs of a
    /// fixed length).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Positions the device step's cache holds (default: the prompt plus --max-tokens); at
    /// most the model's context.
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Decode a store through tensor ops where the device step would run (q8 on a GPU), for
    /// comparisons; GGUF blocks on a GPU have no tensor-ops path.
    #[arg(long)]
    pub no_device_step: bool,
    /// After generating, run the device step's decode steps again under the device's timer
    /// and report its time per token (`device_us_per_token`). It counts the device's waits for
    /// the host between submissions, which are few: a submission takes up to 512 launches
    /// (`CUBECL_WGPU_MAX_TASKS` overrides). Also reports each kind of launch's device time in
    /// one step (`device_us_by_launch`), the prompt's prefill as a whole (`prompt_device_us`)
    /// and by launch (`prompt_device_us_by_launch`).
    #[arg(long)]
    pub device_time: bool,
    /// Sampling temperature; 0 means greedy (negative or NaN is refused).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f64,
    /// Nucleus sampling mass (with a temperature above 0).
    #[arg(long, default_value_t = 0.9)]
    pub top_p: f64,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Store dtype when converting: blocks (the projections and LM head keep the GGUF's
    /// quantized blocks), q8 (int8 projections and LM head with a scale per row), or f32,
    /// f16, bf16; norms and embedding are f32 in the quantized stores. The store is cached as
    /// `stores/<gguf stem>-<dtype>`. Default: none, the GGUF read in place (on a GPU its
    /// blocks are uploaded as they are and read by the device step).
    #[arg(long)]
    pub dtype: Option<WeightFormat>,
    /// Refuse any write access to mapped weights (also `BURN_MAPPED_STRICT=1`).
    #[arg(long)]
    pub strict: bool,
    /// Check every tensor's checksum while loading (reads the whole store once); off by
    /// default, when only names, sizes and file types are checked (`burn-mapped verify`
    /// checks a store on its own).
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of streaming text.
    #[arg(long)]
    pub json: bool,
    /// Cache directory for downloads and converted stores.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Keep compiled GPU kernels in this directory for later processes, and read what earlier
    /// ones kept (`vulkan` builds; CubeCL's compilation store). On `--device vulkan` it is
    /// `<cache-dir>/kernels` unless given or turned off.
    #[arg(long, conflicts_with = "no_kernel_cache")]
    pub kernel_cache: Option<PathBuf>,
    /// Compile every GPU kernel in this process, keeping none (for measurements).
    #[arg(long)]
    pub no_kernel_cache: bool,
    /// Device and weight placement.
    #[command(flatten)]
    pub place: PlacementArgs,
}

#[derive(Serialize)]
struct Summary {
    model: String,
    store: String,
    placement: &'static str,
    device: &'static str,
    /// Whether write access to the mapped weights is refused (`--strict` or
    /// `BURN_MAPPED_STRICT`).
    strict: bool,
    /// The auto placement's decision (probe, verdict, cache), when `--placement auto`.
    placement_decision: Option<Decision>,
    /// Bytes the per-use-copy placement copied during the run (0 for the other placements).
    staged_bytes: u64,
    /// Whether Ctrl-C ended the generation early (the tokens are those chosen before it).
    interrupted: bool,
    /// Whether the weights were the GGUF itself, read in place (no store, no conversion).
    in_place: bool,
    /// Tensors a GGUF read in place could not adopt where they lie, copied once at load.
    copied_tensors: usize,
    /// Their bytes.
    copied_bytes: u64,
    prompt: String,
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    text: String,
    /// Starting the GPU runtime (instance, adapter, device), before the model loads; not part of
    /// `model_ready_ms` or `time_to_first_token_ms`, which count from its end. `None` on the CPU
    /// and where the runtime starts at first use (no device step, or `CUBECL_WGPU_MAX_TASKS`).
    device_open_ms: Option<f64>,
    model_ready_ms: f64,
    /// Reading the vocabulary (from the GGUF's header or the tokenizer file), after the model
    /// is ready and before the prompt runs.
    tokenizer_ms: f64,
    /// Building the device step (its buffers), before the prompt runs. Not the weights'
    /// upload, which the load makes (`uploaded_bytes`).
    device_step_setup_ms: Option<f64>,
    /// Weight bytes the load copied onto the GPU through burn-mapped's staging ring (`None`
    /// on the CPU). What it did not copy went through Burn's own upload.
    uploaded_bytes: Option<u64>,
    time_to_first_token_ms: f64,
    decode_tokens: usize,
    decode_tokens_per_s: f64,
    rss_anon_bytes: u64,
    rss_file_bytes: u64,
    /// `device step (recorded)`, `device step (launched)` or `tensor ops`.
    decode_path: &'static str,
    /// The CPU kernels' tier (`scalar`, `avx2`, `avx512vnni`: the best this CPU runs, or
    /// `BURN_MAPPED_CPU`'s), which the host's products run.
    cpu_tier: &'static str,
    /// Why the device step did not take the model, where it was asked for and refused.
    device_step_refused: Option<String>,
    /// GPU kernels compiled by this process and read from the kernel cache (`vulkan` builds).
    kernel_cache: Option<KernelCacheReport>,
    /// Kernel launches per token of the device step.
    launches_per_token: Option<usize>,
    /// The host's mean time to enqueue one token's step, in microseconds.
    host_us_per_token: Option<f64>,
    /// The device's time per decode step, in microseconds (`--device-time`, where the device
    /// has a timer).
    device_us_per_token: Option<f64>,
    /// Where that time goes: each kind of launch's device time in one step, in microseconds,
    /// each launch timed alone (so the kinds add up to more than the step).
    device_us_by_launch: Option<Vec<(&'static str, f64)>>,
    /// The device's time for the prompt's prefill, all its passes in one timing window, in
    /// microseconds.
    prompt_device_us: Option<f64>,
    /// The same by kind of launch, each launch timed alone.
    prompt_device_us_by_launch: Option<Vec<(&'static str, f64)>>,
    /// The device step's device memory in bytes: weights, key/value cache, scratch.
    device_memory: Option<DeviceMemory>,
}

/// The device step's device memory, by purpose.
#[derive(Serialize)]
struct DeviceMemory {
    /// The model's parameters the step reads.
    weights_bytes: u64,
    /// The key and value cache.
    cache_bytes: u64,
    /// Activations, logits, sampling and position tables, the largest prompt pass's
    /// activations.
    scratch_bytes: u64,
}

/// How the tokens were decoded, for the summary.
struct DecodePath {
    name: &'static str,
    setup_ms: Option<f64>,
    launches_per_token: Option<usize>,
    host_us_per_token: Option<f64>,
    device_us_per_token: Option<f64>,
    device_us_by_launch: Option<Vec<(&'static str, f64)>>,
    prompt_device_us: Option<f64>,
    prompt_device_us_by_launch: Option<Vec<(&'static str, f64)>>,
    device_memory: Option<DeviceMemory>,
}

const TENSOR_OPS: DecodePath = DecodePath {
    name: "tensor ops",
    setup_ms: None,
    launches_per_token: None,
    host_us_per_token: None,
    device_us_per_token: None,
    device_us_by_launch: None,
    prompt_device_us: None,
    prompt_device_us_by_launch: None,
    device_memory: None,
};

/// The prompt and the requested tokens do not fit the model's context.
#[derive(Debug, thiserror::Error)]
#[error(
    "the prompt ({prompt} tokens) plus --max-tokens {max_tokens} exceeds the model's context of \
     {context} tokens"
)]
pub struct ContextExceeded {
    /// Prompt tokens.
    pub prompt: usize,
    /// Requested new tokens.
    pub max_tokens: usize,
    /// The model's context length.
    pub context: usize,
}

/// Checks that `prompt` tokens and `max_tokens` new ones fit a context of `context` tokens
/// (the KV cache is allocated for their sum).
///
/// # Errors
/// [`ContextExceeded`].
pub fn check_context(
    prompt: usize,
    max_tokens: usize,
    context: usize,
) -> Result<(), ContextExceeded> {
    if prompt.saturating_add(max_tokens) > context {
        return Err(ContextExceeded {
            prompt,
            max_tokens,
            context,
        });
    }
    Ok(())
}

/// The cache positions for `--ctx` (default: the prompt plus `--max-tokens`): refused, naming
/// `--ctx`, when it exceeds the model's `context` or cannot hold the generation (the prompt
/// and every new token but the last, which is never fed back).
///
/// # Errors
/// When `ctx` is too large or too small.
pub fn check_ctx(
    ctx: Option<usize>,
    prompt: usize,
    max_tokens: usize,
    context: usize,
) -> anyhow::Result<usize> {
    let needed = prompt + max_tokens.saturating_sub(1);
    let Some(ctx) = ctx else {
        return Ok(prompt + max_tokens);
    };
    anyhow::ensure!(
        ctx <= context,
        "--ctx {ctx} exceeds the model's context of {context} tokens"
    );
    anyhow::ensure!(
        ctx >= needed,
        "--ctx {ctx} cannot hold the prompt ({prompt} tokens) and --max-tokens {max_tokens} \
         (it needs {needed} positions: the last token is never stored)"
    );
    Ok(ctx)
}

/// The sampler for `--temperature`: exactly 0 is greedy; anything else must be a finite
/// positive temperature with a `top_p` in (0, 1].
///
/// # Errors
/// The sampler's refusal of a NaN, infinite or negative temperature or a bad `top_p`.
pub fn sampler_for(temperature: f64, top_p: f64, seed: u64) -> Result<Sampler, SamplingError> {
    Sampler::new(if temperature == 0.0 {
        Sampling::Greedy
    } else {
        Sampling::TopP {
            temperature,
            top_p,
            seed,
        }
    })
}

/// Where this run keeps compiled kernels: the directory asked for on a GPU; by default
/// `<cache>/kernels` on the SPIR-V device (`vulkan`), the one whose kernels the cache keeps;
/// none on the CPU or with `--no-kernel-cache`. It halves a new process's wait for its first
/// token on an H200 (docs/GPU.md).
fn kernel_cache_dir(args: &GenerateArgs, cache: &Path) -> Option<PathBuf> {
    match (&args.kernel_cache, args.place.device) {
        (_, DeviceArg::Cpu) => None,
        (Some(dir), _) => Some(dir.clone()),
        (None, DeviceArg::Vulkan) if !args.no_kernel_cache => Some(cache.join("kernels")),
        _ => None,
    }
}

/// Runs `generate`.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let cache = args.cache_dir.clone().unwrap_or_else(default_cache_dir);
    // Before any GPU runtime starts, which reads CubeCL's configuration once.
    let kernels = kernel_cache_dir(args, &cache).and_then(|dir| KernelCache::enable(&dir));
    // Not started yet: a GPU runtime starts at its first use or at `decode_device`.
    let device = args.place.device.device();
    // Without --dtype the GGUF is read in place, on a GPU as on the CPU.
    let format = args.dtype;
    // The device step submits its steps itself, each whole; tensor ops keep CubeCL's own
    // batches, which let the GPU start while the host is still launching.
    let stepped = matches!(format, None | Some(WeightFormat::Q8 | WeightFormat::Blocks));
    let (device, device_open) = if stepped && !args.no_device_step {
        args.place.device.decode_device()?
    } else {
        (device, None)
    };
    let bar = super::progress::bytes_bar(0, "converting", args.json);
    let mut progress = |p: &Progress<'_>| {
        bar.set_length(p.total_bytes);
        bar.set_position(p.done_bytes);
        bar.set_message(crate::text::printable(p.tensor).into_owned());
    };
    let paths = qwen::resolve(&args.model, format, &cache, Some(&mut progress))?;
    bar.finish_and_clear();

    let weights = paths.weights_path();
    let (placement, decision) = args
        .place
        .resolve(weights, args.json)
        .with_context(|| format!("choosing a placement for {}", weights.display()))?;
    let start = Instant::now();
    let options = qwen::open_options(args.strict).verify(args.verify);
    let mut loaded = load(paths.weights(), &device, options, placement)
        .with_context(|| format!("loading {} ({placement})", weights.display()))?;
    let model_ready = start.elapsed();
    let tokenizer = match loaded.header.take() {
        Some(header) => Qwen2Tokenizer::from_gguf(header).map_err(anyhow::Error::from),
        None => qwen::load_tokenizer(&paths).map_err(anyhow::Error::from),
    }
    .with_context(|| format!("reading the vocabulary of {}", paths.gguf.display()))?;
    let tokenizer_time = start.elapsed() - model_ready;

    let prompt = if args.chat {
        chat_prompt(args.system.as_deref(), &args.prompt)
    } else {
        args.prompt.clone()
    };
    let prompt_ids = tokenizer.encode(&prompt)?;
    let context = loaded.config.max_position_embeddings;
    check_context(prompt_ids.len(), args.max_tokens, context)?;
    let ctx = check_ctx(args.ctx, prompt_ids.len(), args.max_tokens, context)?;
    loaded.model.check_cache(ctx)?;
    let mut sampler = sampler_for(args.temperature, args.top_p, args.seed)?;
    let mut stream = tokenizer.stream_text_decoder();
    let mut first_token = None;
    // The decode ends at the last token, before any `--device-time` replays.
    let mut last_token = None;
    let mut stdout = std::io::stdout().lock();
    let mut stream_error = None;
    let stop: &[u32] = if args.ignore_eos {
        &[]
    } else {
        tokenizer.eos_ids()
    };
    crate::interrupt::catch();
    let on_token = |id| {
        let now = start.elapsed();
        first_token.get_or_insert(now);
        last_token = Some(now);
        if !args.json {
            match stream.push(id) {
                Ok(Some(piece)) => {
                    let _ = stdout.write_all(crate::text::printable(&piece).as_bytes());
                    let _ = stdout.flush();
                }
                Ok(None) => {}
                Err(e) => {
                    stream_error.get_or_insert(e);
                }
            }
        }
        if crate::interrupt::interrupted() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let mut on_token = on_token;
    let step = DeviceRun {
        // Only CubeCL devices run the step; asked on the CPU, it would only say so.
        wanted: !args.no_device_step && !burn_mapped::placement::is_flex(&device),
        time_device: args.device_time,
        ctx,
        prompt: &prompt_ids,
        max_tokens: args.max_tokens,
        stop,
    };
    let mut device_step_refused = None;
    let (generated, path) = match step.run(&loaded.model, &mut sampler, &mut on_token)? {
        Stepped::Ran(generated, path) => (generated, path),
        stepped => {
            let gpu_blocks = !burn_mapped::placement::is_flex(&device) && loaded.model.has_blocks();
            if let Stepped::Refused(reason) = stepped {
                if gpu_blocks {
                    anyhow::bail!(
                        "the device step refused the model: {reason}; GGUF blocks on a GPU are \
                         read by the device step only (convert with --dtype q8 for tensor ops)"
                    );
                }
                tell!("[device step refused: {reason}; decoding through tensor ops]");
                device_step_refused = Some(reason);
            } else if gpu_blocks {
                anyhow::bail!(
                    "GGUF blocks on a GPU are read by the device step only; without it, convert \
                     with --dtype q8"
                );
            }
            let model = loaded.model.clone().with_device_step(false);
            let generated = model.generate_until(
                &prompt_ids,
                args.max_tokens,
                &mut sampler,
                stop,
                &mut on_token,
            )?;
            (generated, TENSOR_OPS)
        }
    };
    if let Some(e) = stream_error {
        return Err(e.into());
    }
    let end = last_token.unwrap_or_else(|| start.elapsed());
    let ttft = first_token.unwrap_or(end);
    let decode_tokens = generated.len().saturating_sub(1);
    let decode_secs = (end - ttft).as_secs_f64();
    let rss = rss_self()?;
    let summary = Summary {
        model: args.model.clone(),
        store: weights.display().to_string(),
        placement: placement.name(),
        device: args.place.device.name(),
        strict: loaded.store.strict() == burn_mapped::readonly::StrictMode::Strict,
        placement_decision: decision,
        staged_bytes: loaded.stager.as_ref().map_or(0, |s| s.staged_bytes()),
        interrupted: crate::interrupt::interrupted(),
        in_place: matches!(paths.weights, qwen::WeightsPath::Gguf(_)),
        copied_tensors: loaded.store.copied().len(),
        copied_bytes: loaded.store.copied().iter().map(|(_, b)| b).sum(),
        text: tokenizer.decode_text(&generated)?,
        prompt,
        prompt_ids,
        generated_ids: generated,
        device_open_ms: device_open.map(|d| d.as_secs_f64() * 1e3),
        model_ready_ms: model_ready.as_secs_f64() * 1e3,
        tokenizer_ms: tokenizer_time.as_secs_f64() * 1e3,
        device_step_setup_ms: path.setup_ms,
        uploaded_bytes: uploaded_bytes(&device),
        time_to_first_token_ms: ttft.as_secs_f64() * 1e3,
        decode_tokens,
        decode_tokens_per_s: if decode_secs > 0.0 {
            decode_tokens as f64 / decode_secs
        } else {
            0.0
        },
        rss_anon_bytes: rss.anon,
        rss_file_bytes: rss.file,
        decode_path: path.name,
        cpu_tier: burn_mapped::host::cpu_tier().name(),
        device_step_refused,
        kernel_cache: kernels.map(KernelCache::finish),
        launches_per_token: path.launches_per_token,
        host_us_per_token: path.host_us_per_token,
        device_us_per_token: path.device_us_per_token,
        device_us_by_launch: path.device_us_by_launch,
        prompt_device_us: path.prompt_device_us,
        prompt_device_us_by_launch: path.prompt_device_us_by_launch,
        device_memory: path.device_memory,
    };
    drop(stdout);
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        let rest = stream.finish();
        say!("{rest}");
        tell!(
            "[{} on {} | {} | model-ready {:.0} ms | first token {:.0} ms | decode {:.2} tok/s over {} tokens | RssAnon {} MiB | RssFile {} MiB]",
            summary.placement,
            summary.device,
            summary.decode_path,
            summary.model_ready_ms,
            summary.time_to_first_token_ms,
            summary.decode_tokens_per_s,
            summary.decode_tokens,
            summary.rss_anon_bytes >> 20,
            summary.rss_file_bytes >> 20
        );
        if let Some(k) = &summary.kernel_cache {
            tell!(
                "[kernels: {} compiled, {} from the cache in {}]",
                k.compiled,
                k.loaded,
                k.dir.display()
            );
        }
    }
    Ok(())
}

/// What the device step did with a generation.
enum Stepped {
    /// It generated the tokens.
    #[cfg_attr(
        not(any(feature = "wgpu", feature = "vulkan")),
        expect(dead_code, reason = "only a GPU build runs the device step")
    )]
    Ran(Vec<u32>, DecodePath),
    /// It was asked for and does not take the model, for this reason.
    Refused(String),
    /// It was not asked for (the CPU, or `--no-device-step`).
    NotAsked,
}

/// A generation the device step may take.
struct DeviceRun<'a> {
    wanted: bool,
    /// Time the decode steps on the device after generating (`--device-time`).
    time_device: bool,
    ctx: usize,
    prompt: &'a [u32],
    max_tokens: usize,
    stop: &'a [u32],
}

impl DeviceRun<'_> {
    /// The tokens through the device step where `model` takes it (a q8 store on a CubeCL
    /// device), or `None` for the caller to decode through tensor ops.
    #[cfg(any(feature = "wgpu", feature = "vulkan"))]
    fn run(
        &self,
        model: &burn_mapped_models::qwen2::Qwen2ForCausalLM,
        sampler: &mut Sampler,
        on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> anyhow::Result<Stepped> {
        use burn_mapped_models::qwen2::DeviceDecoder;
        if !self.wanted {
            return Ok(Stepped::NotAsked);
        }
        let setup = std::time::Instant::now();
        let mut decoder = match DeviceDecoder::try_new(model, self.ctx) {
            Ok(decoder) => decoder,
            Err(refused) => return Ok(Stepped::Refused(refused.to_string())),
        };
        let setup_ms = setup.elapsed().as_secs_f64() * 1e3;
        let generated =
            decoder.generate_until(self.prompt, self.max_tokens, sampler, self.stop, on_token)?;
        // A timing that fails costs the figure, not the tokens already generated.
        fn timing<T>(what: &str, timed: Result<Option<T>, impl std::fmt::Display>) -> Option<T> {
            timed.unwrap_or_else(|e| {
                tell!("--device-time ({what}): {e}");
                None
            })
        }
        let us = |t: std::time::Duration| t.as_secs_f64() * 1e6;
        let kinds_us = |kinds: Vec<(&'static str, std::time::Duration)>| {
            kinds.into_iter().map(|(kind, t)| (kind, us(t))).collect()
        };
        let (
            device_us_per_token,
            device_us_by_launch,
            prompt_device_us,
            prompt_device_us_by_launch,
        ) = if self.time_device {
            let per_token = timing("per token", decoder.device_time_per_step(usize::MAX));
            let by_launch = timing("by launch", decoder.device_time_by_launch());
            // Last: these leave the position past the prompt.
            let prompt = timing("prompt", decoder.prompt_device_time());
            let prompt_kinds = timing("prompt by launch", decoder.prompt_time_by_launch());
            (
                per_token.map(us),
                by_launch.map(kinds_us),
                prompt.map(us),
                prompt_kinds.map(kinds_us),
            )
        } else {
            (None, None, None, None)
        };
        let path = DecodePath {
            setup_ms: Some(setup_ms),
            name: if decoder.is_recorded() {
                "device step (recorded)"
            } else {
                "device step (launched)"
            },
            launches_per_token: Some(decoder.launches_per_token()),
            host_us_per_token: decoder.host_time_per_token().map(|t| t.as_secs_f64() * 1e6),
            device_us_per_token,
            device_us_by_launch,
            prompt_device_us,
            prompt_device_us_by_launch,
            device_memory: Some({
                let b = decoder.device_bytes();
                DeviceMemory {
                    weights_bytes: b.weights,
                    cache_bytes: b.cache,
                    scratch_bytes: b.scratch,
                }
            }),
        };
        Ok(Stepped::Ran(generated, path))
    }

    /// Without a GPU backend built in there is no device step.
    #[cfg(not(any(feature = "wgpu", feature = "vulkan")))]
    fn run(
        &self,
        _model: &burn_mapped_models::qwen2::Qwen2ForCausalLM,
        _sampler: &mut Sampler,
        _on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> anyhow::Result<Stepped> {
        let _ = (
            self.time_device,
            self.ctx,
            self.prompt,
            self.max_tokens,
            self.stop,
        );
        Ok(if self.wanted {
            Stepped::Refused("this build has no GPU backend (cargo feature wgpu or vulkan)".into())
        } else {
            Stepped::NotAsked
        })
    }
}

/// The bytes loads copied onto `device` through burn-mapped's staging ring, where it has one.
#[cfg(any(feature = "wgpu", feature = "vulkan"))]
fn uploaded_bytes(device: &burn::tensor::Device) -> Option<u64> {
    burn_mapped::upload::is_registered(device).then(|| burn_mapped::upload::totals().bytes)
}

/// No GPU backend built in: nothing uploads.
#[cfg(not(any(feature = "wgpu", feature = "vulkan")))]
fn uploaded_bytes(_device: &burn::tensor::Device) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_mapped::convert::CastTo;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: GenerateArgs,
    }

    #[test]
    fn kernels_are_kept_under_the_cache_on_vulkan_unless_asked_otherwise() {
        // The device set after parsing: a build parses only the devices it has.
        let dir = |device: DeviceArg, argv: &[&str]| {
            let mut cli =
                Cli::try_parse_from(["generate", "--prompt", "hi"].iter().chain(argv)).unwrap();
            cli.args.place.device = device;
            kernel_cache_dir(&cli.args, Path::new("/c"))
        };
        let kept = Some(PathBuf::from("/c/kernels"));
        assert_eq!(dir(DeviceArg::Vulkan, &[]), kept);
        assert_eq!(dir(DeviceArg::Vulkan, &["--no-kernel-cache"]), None);
        let asked = Some(PathBuf::from("/k"));
        assert_eq!(dir(DeviceArg::Wgpu, &["--kernel-cache", "/k"]), asked);
        assert_eq!(dir(DeviceArg::Vulkan, &["--kernel-cache", "/k"]), asked);
        // WGSL compiles in the driver: nothing to keep unless asked; nothing on the CPU.
        assert_eq!(dir(DeviceArg::Wgpu, &[]), None);
        assert_eq!(dir(DeviceArg::Cpu, &["--kernel-cache", "/k"]), None);
        let both = ["--kernel-cache", "/k", "--no-kernel-cache"];
        assert!(Cli::try_parse_from(["generate", "--prompt", "hi"].iter().chain(&both)).is_err());
    }

    #[test]
    fn dtype_is_parsed_into_a_weight_format_or_refused_by_name() {
        let format = |value: &str| {
            Cli::try_parse_from(["generate", "--prompt", "hi", "--dtype", value])
                .map(|cli| cli.args.dtype)
        };
        assert_eq!(format("q8").unwrap(), Some(WeightFormat::Q8));
        assert_eq!(
            format("BF16").unwrap(),
            Some(WeightFormat::Float(CastTo::BF16))
        );
        assert_eq!(format("blocks").unwrap(), Some(WeightFormat::Blocks));
        let refused = format("int4").err().unwrap().to_string();
        assert!(
            refused.contains("unknown weight format `int4`"),
            "{refused}"
        );
        let default = Cli::try_parse_from(["generate", "--prompt", "hi"])
            .unwrap()
            .args
            .dtype;
        assert_eq!(default, None);
    }
}
