//! llama.cpp's decode rate on the same GGUF, for scale, through `llama-cpp-python` when it
//! is installed (`pip install llama-cpp-python`); otherwise the report says it was not run.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::report::LlamaCpp;

const SCRIPT: &str = r#"
import json, sys, time
import numpy as np
import llama_cpp
from llama_cpp import Llama
gguf, ids, n, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t0 = time.perf_counter()
llm = Llama(model_path=gguf, n_ctx=max(512, len(ids) + n + 8), n_threads=threads,
            n_threads_batch=threads, n_batch=512, verbose=False)
t1 = time.perf_counter()
vocab = llm.n_vocab()
def last_logits():
    # Without logits_all, llama-cpp-python keeps no scores; read the context's last row.
    return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
llm.eval(ids)
tokens = [int(np.argmax(last_logits()))]
t2 = time.perf_counter()
for _ in range(n):
    llm.eval([tokens[-1]])
    tokens.append(int(np.argmax(last_logits())))
t3 = time.perf_counter()
print(json.dumps({"version": llama_cpp.__version__, "load_ms": (t1 - t0) * 1e3,
                  "prompt_ms": (t2 - t1) * 1e3, "decode_tok_s": n / (t3 - t2), "tokens": tokens}))
"#;

#[derive(Deserialize)]
struct Out {
    version: String,
    load_ms: f64,
    prompt_ms: f64,
    decode_tok_s: f64,
    tokens: Vec<u32>,
}

fn not_run(status: String, threads: usize) -> LlamaCpp {
    LlamaCpp {
        status,
        version: None,
        threads,
        load_ms: 0.0,
        prompt_ms: 0.0,
        decode_tokens: 0,
        decode_tok_s: 0.0,
        tokens: Vec::new(),
    }
}

/// Measures llama.cpp, or records why it could not.
pub fn measure(
    gguf: &Path,
    prompt: &[u32],
    decode_tokens: usize,
    threads: usize,
) -> Result<LlamaCpp> {
    let probe = Command::new("python3")
        .args(["-c", "import llama_cpp, numpy"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        _ => {
            return Ok(not_run(
                "not measured: python3 with llama-cpp-python and numpy is not installed".into(),
                threads,
            ));
        }
    }
    let out = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(gguf)
        .arg(serde_json::to_string(prompt)?)
        .arg(decode_tokens.to_string())
        .arg(threads.to_string())
        .output()
        .context("running llama-cpp-python")?;
    if !out.status.success() {
        return Ok(not_run(
            format!(
                "not measured: llama-cpp-python failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ),
            threads,
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    let o: Out =
        serde_json::from_str(line).with_context(|| format!("llama-cpp-python printed `{line}`"))?;
    Ok(LlamaCpp {
        status: "measured".into(),
        version: Some(o.version),
        threads,
        load_ms: o.load_ms,
        prompt_ms: o.prompt_ms,
        decode_tokens,
        decode_tok_s: o.decode_tok_s,
        tokens: o.tokens,
    })
}
