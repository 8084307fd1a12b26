"""Per-chunk attention cost on CPU: explicit boolean mask vs ``causal_lower_right``, by chunk and prefix.

Question: does the runtime's explicit ``[c, L + c]`` boolean mask keep
``scaled_dot_product_attention`` off a fused kernel, so that CPU runs favour small chunks for a
reason that has nothing to do with the method? ``torch.nn.attention.bias.causal_lower_right``
states the same chunk-causal pattern (query ``i`` sees keys ``<= L + i``) without a tensor.

For every (chunk c, prefix L) it times one SDPA call of tiny-qwen3's attention shape (4 query
heads, 2 KV heads, head dim 16, fp32, one thread, as a rank runs) with each variant, best of
``--repeat`` timed calls after a warm-up, and checks that the two outputs are bitwise equal.
It also reports the cost per token of the context (``L + c``), which is flat when the kernel's
cost is proportional to the work.

Usage: ``python benchmarks/attention_mask.py [--repeat 7] [--out benchmarks/results/attention_mask.json]``
(about a minute). Output: a table on stdout and the JSON; docs/runtime-results.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))

from sglang_vpp.runtime.models.layers import chunk_mask  # noqa: E402

CHUNKS = (64, 128, 256, 512, 1024, 2048)
PREFIXES = (0, 2048, 6144, 14336)
HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16


def _best_of(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        began = time.thread_time()
        fn()
        best = min(best, time.thread_time() - began)
    return best


def measure(chunk: int, prefix: int, repeat: int) -> dict:
    generator = torch.Generator().manual_seed(chunk * 100003 + prefix)
    q = torch.randn(1, HEADS, chunk, HEAD_DIM, generator=generator)
    k = torch.randn(1, KV_HEADS, prefix + chunk, HEAD_DIM, generator=generator)
    v = torch.randn(1, KV_HEADS, prefix + chunk, HEAD_DIM, generator=generator)

    def explicit() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=chunk_mask(prefix, chunk), enable_gqa=True)

    def lower_right() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(chunk, prefix + chunk),
                                              enable_gqa=True)

    diff = float((explicit() - lower_right()).abs().max())
    t_explicit, t_lower_right = _best_of(explicit, repeat), _best_of(lower_right, repeat)
    return {"chunk": chunk, "prefix": prefix, "explicit_mask_s": t_explicit, "causal_lower_right_s": t_lower_right,
            "max_abs_diff": diff, "explicit_ns_per_query_key": t_explicit / (chunk * (prefix + chunk)) * 1e9,
            "lower_right_ns_per_query_key": t_lower_right / (chunk * (prefix + chunk)) * 1e9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "attention_mask.json")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the ranks' setting
    rows = [measure(c, p, args.repeat) for p in PREFIXES for c in CHUNKS]
    print(f"{'chunk':>6} {'prefix':>6} {'explicit ms':>12} {'lower-right ms':>15} {'ratio':>6} "
          f"{'ns/qk expl':>11} {'ns/qk l-r':>10} {'max|diff|':>10}")
    for r in rows:
        print(f"{r['chunk']:>6} {r['prefix']:>6} {r['explicit_mask_s'] * 1e3:>12.3f} {r['causal_lower_right_s'] * 1e3:>15.3f} "
              f"{r['causal_lower_right_s'] / r['explicit_mask_s']:>6.2f} {r['explicit_ns_per_query_key']:>11.3f} "
              f"{r['lower_right_ns_per_query_key']:>10.3f} {r['max_abs_diff']:>10.1e}")
    meta = {"torch": torch.__version__, "threads": 1, "dtype": "float32", "heads": HEADS, "kv_heads": KV_HEADS,
            "head_dim": HEAD_DIM, "repeat": args.repeat, "timer": "thread CPU time, best of repeat"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
