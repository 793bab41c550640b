"""Compare two checkpoints tensor by tensor: ``python -m mdk.tools.ckpt_diff A.pth B.pth``
(docs/distributed.md). Each tensor's largest absolute difference and its largest difference
relative to the tensor's scale, ``max|a-b| / max(max|a|, max|b|)``: not element-wise, so a weight
that is 1e-9 in one run and 2e-9 in the other is not a 100% disagreement. Exit status: 0 within
tolerance, 1 above it, 2 when the two files do not hold the same tensors (names or shapes).
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

import torch

from mdk.checkpoint.weights_file import read_weights
from mdk.errors import CheckpointError


@dataclass(frozen=True)
class TensorDiff:
    name: str
    shape: tuple[int, ...]
    max_abs: float
    max_rel: float   # max|a-b| / max(max|a|, max|b|); 0 when both tensors are all zero
    scale: float     # max(max|a|, max|b|)


def tensor_diff(name: str, a: torch.Tensor, b: torch.Tensor) -> TensorDiff:
    """Differences computed in float64 so the report itself adds no rounding."""
    a64, b64 = a.detach().cpu().double(), b.detach().cpu().double()
    max_abs = float((a64 - b64).abs().max()) if a64.numel() else 0.0
    scale = max(float(a64.abs().max()), float(b64.abs().max())) if a64.numel() else 0.0
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else math.inf)
    return TensorDiff(name, tuple(a.shape), max_abs, rel, scale)


def flatten(state: Mapping, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensors of a (nested) state dict under dotted names; other values are ignored."""
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        name = f"{prefix}{k}"
        if isinstance(v, torch.Tensor):
            out[name] = v
        elif isinstance(v, Mapping):
            out.update(flatten(v, name + "."))
        elif isinstance(v, (list, tuple)):
            out.update(flatten(dict(enumerate(v)), name + "."))
    return out


def diff_state_dicts(a: Mapping, b: Mapping) -> tuple[list[TensorDiff], list[str]]:
    """Per-tensor differences of the tensors both hold, and the structural problems (names
    present in only one, shape mismatches), each problem a sentence."""
    fa, fb = flatten(a), flatten(b)
    problems = [f"{k}: only in the first" for k in fa if k not in fb]
    problems += [f"{k}: only in the second" for k in fb if k not in fa]
    both = [k for k in fa if k in fb]
    problems += [f"{k}: shape {tuple(fa[k].shape)} vs {tuple(fb[k].shape)}"
                 for k in both if fa[k].shape != fb[k].shape]
    return [tensor_diff(k, fa[k], fb[k]) for k in both if fa[k].shape == fb[k].shape], problems


def format_table(diffs: list[TensorDiff], top: Optional[int] = None) -> str:
    """Worst first (by relative difference)."""
    rows = sorted(diffs, key=lambda d: (-d.max_rel, -d.max_abs))[:top]
    w = max([len(d.name) for d in rows] + [6])
    lines = [f"{'tensor':<{w}}  {'shape':<18} {'max abs':>10} {'max rel':>10} {'scale':>10}"]
    for d in rows:
        lines.append(f"{d.name:<{w}}  {str(list(d.shape)):<18} {d.max_abs:10.3e} {d.max_rel:10.3e} "
                     f"{d.scale:10.3e}")
    return "\n".join(lines)


def _load(path: str, key: str) -> Mapping:
    advice = "compare two checkpoints written by mdk (a stage's best.pth/last.pth)"
    try:
        f = read_weights(Path(path), advice)
        ck = f.stage_checkpoint(advice)
    except CheckpointError as e:
        raise SystemExit(f"ckpt_diff: {e}") from None
    print(f"{path} is {f.describe()}")
    if key not in ck:
        raise SystemExit(f"ckpt_diff: {path} has no '{key}' entry (it has {sorted(ck)}); "
                         "choose one with --key")
    return ck[key]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.ckpt_diff", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--key", default="model", help="which entry to compare (default: model)")
    ap.add_argument("--rtol", type=float, default=1e-6, help="max relative difference allowed")
    ap.add_argument("--atol", type=float, default=None, help="max absolute difference allowed")
    ap.add_argument("--top", type=int, default=20, help="tensors to list (worst first; 0 = all)")
    args = ap.parse_args(argv)
    diffs, problems = diff_state_dicts(_load(args.a, args.key), _load(args.b, args.key))
    for p in problems:
        print(f"MISMATCH {p}")
    if diffs:
        print(format_table(diffs, args.top or None))
        worst = max(diffs, key=lambda d: d.max_rel)
        print(f"{len(diffs)} tensors; largest relative difference {worst.max_rel:.3e} "
              f"({worst.name}), largest absolute {max(d.max_abs for d in diffs):.3e}")
    if problems:
        return 2
    ok = all(d.max_rel <= args.rtol and (args.atol is None or d.max_abs <= args.atol)
             for d in diffs)
    print("OK: within tolerance" if ok else f"FAIL: above rtol={args.rtol:g}"
          + (f" / atol={args.atol:g}" if args.atol is not None else ""))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
