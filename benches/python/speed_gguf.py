"""Make a speed-test GGUF: a real checkpoint's header (tensor table, tokenizer, config) with random
quantized blocks whose scales are small and finite, and F32 tensors (norms, biases) set to 1 / 0.
Same sizes and types as the real file, so load and decode cost the same; the text is nonsense.
Usage: python3 speed_gguf.py HEADER_GGUF OUT_GGUF TOTAL_BYTES, with the `gguf` package importable
(PyPI `gguf`, pure Python: carry its wheel to a machine without a registry). Headers:
- Qwen2.5-Coder-0.5B-Instruct Q4_K_M: the first 5,947,776 bytes of the real checkpoint;
  TOTAL_BYTES 491,400,064.
- DeepSeek-R1-Distill-Qwen-7B Q4_K_M (Qwen2 architecture, 28 layers, 3584 wide, GQA 28/4):
  its first 5,953,248 bytes (sha256 3358ed98...34bf6); TOTAL_BYTES 4,683,073,248. Only its header is public
  here, so at 7B only speed and memory can be measured, not tokens."""
import shutil, sys
import numpy as np
from gguf import GGUFReader

hdr, out, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
shutil.copyfile(hdr, out)
with open(out, 'r+b') as f:
    f.truncate(total)
r = GGUFReader(out)
mm = np.memmap(out, dtype=np.uint8, mode='r+')
rng = np.random.default_rng(0)
# (block bytes, offsets of f16 scale fields within a block)
layout = {'Q8_0': (34, [0]), 'Q5_0': (22, [0]), 'Q4_K': (144, [0, 2]), 'Q6_K': (210, [208])}
scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
for t in r.tensors:
    start, n = int(t.data_offset), int(t.n_bytes)
    kind = t.tensor_type.name
    view = mm[start:start + n]
    if kind == 'F32':
        vals = np.zeros(n // 4, np.float32) if t.name.endswith('.bias') else np.ones(n // 4, np.float32)
        view[:] = np.frombuffer(vals.tobytes(), dtype=np.uint8)
        continue
    if kind not in layout:
        raise SystemExit(f'unhandled type {kind} for {t.name}')
    view[:] = rng.integers(0, 256, n, dtype=np.uint8)
    bb, offs = layout[kind]
    blocks = view.reshape(-1, bb)
    for o in offs:
        blocks[:, o] = scale[0]; blocks[:, o + 1] = scale[1]
    if kind == 'Q6_K':  # int8 sub-block scales: keep them small and positive
        blocks[:, 192:208] = rng.integers(1, 8, (blocks.shape[0], 16), dtype=np.uint8)
mm.flush()
print(f'wrote {out}: {len(r.tensors)} tensors, {total} bytes')
