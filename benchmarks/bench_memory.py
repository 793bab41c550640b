"""Peak memory of a training step with and without activation checkpointing (issue 7).

    python benchmarks/bench_memory.py                 # model=gnetdet (448 px), batch 8
    python benchmarks/bench_memory.py --model gnetdet_small --batch 16

Each mode runs in a fresh subprocess (peak RSS is a per-process high-water mark, so two modes in
one process would hide each other). The child builds the model through the engine's
``build_model`` from the real config with ``trainer.activation_checkpointing=<mode>``, records
its RSS once model, optimizer, loss and batch exist ("base"), runs ``--steps`` training steps
(forward, loss, backward, AdamW step) and reports ``ru_maxrss``. The training-step peak is
``peak - base``: activations, gradients, optimizer state and recompute buffers; the whole-process
peak adds ~0.4 GB of libraries and weights that checkpointing cannot touch. Both are printed;
the goal (>= 45 % lower) is judged on the training-step peak. On CUDA the same child reports
``torch.cuda.max_memory_allocated`` instead.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(model_name: str, batch: int, ckpt: bool, steps: int, threads: int, smoke: bool) -> dict:
    import torch

    from mdk.models.build import build_model
    from mdk.engine.build import build_loss

    common.set_threads(threads)
    cfg = common.compose([f"model={model_name}", f"trainer.activation_checkpointing={ckpt}",
                          *(common.SMOKE if smoke else [])])
    torch.manual_seed(0)
    model = build_model(cfg)
    # Set directly too, so the benchmark also runs before the config wiring lands.
    model.activation_checkpointing = ckpt
    dev = common.device(smoke)
    model.to(dev).train()
    loss_fn = build_loss(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    s, b = model.grid, cfg.model.net.boxes_per_cell
    c = 5 * b + cfg.dataset.num_classes
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (batch, 3, model.image_size, model.image_size), dtype=torch.uint8,
                           generator=g).to(dev)
    targets = torch.zeros(batch, s, s, c)
    targets[:, ::3, ::3, :4] = 0.3          # a few responsible cells with plausible boxes
    targets[:, ::3, ::3, 4] = 1.0
    targets[:, ::3, ::3, 5 * b] = 1.0     # class 0 (the classes follow the B box slots)
    targets = targets.to(dev)
    base = _rss_mb()
    losses, held = [], 0.0
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), targets)["total"]
        held = max(held, _rss_mb() - base)  # what the graph keeps between forward and backward
        loss.backward()
        opt.step()
        losses.append(float(loss))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    out = {"ckpt": ckpt, "base_mb": base, "peak_mb": peak, "step_peak_mb": peak - base,
           "held_mb": held,
           "losses": losses}
    if dev.type == "cuda":
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="gnetdet")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads (0: torch default)")
    ap.add_argument("--child", choices=["on", "off"], help=argparse.SUPPRESS)
    common.add_smoke_flag(ap)
    a = ap.parse_args()
    if a.smoke:
        a.model, a.batch, a.steps, a.threads = "gnetdet_small", 4, 1, common.SMOKE_THREADS
    if a.child:
        print(json.dumps(child(a.model, a.batch, a.child == "on", a.steps, a.threads, a.smoke)))
        return
    print(f"# bench_memory: model={a.model} batch={a.batch} steps={a.steps}")
    print(f"# {common.machine()}")
    res = {}
    for mode in ("off", "on"):
        cmd = [sys.executable, __file__, "--child", mode, "--model", a.model, "--batch", str(a.batch),
               "--steps", str(a.steps), "--threads", str(a.threads),
               *(["--smoke"] if a.smoke else [])]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=common.REPO)
        if p.returncode:
            sys.exit(f"child {mode} failed:\n{p.stderr[-3000:]}")
        res[mode] = json.loads(p.stdout.strip().splitlines()[-1])
        r = res[mode]
        print(f"activation_checkpointing={mode:3s}  process peak RSS {r['peak_mb']:7.0f} MB  "
              f"(base {r['base_mb']:.0f} MB)  training-step peak {r['step_peak_mb']:7.0f} MB  "
              f"held after forward {r['held_mb']:6.0f} MB"
              + (f"  cuda peak {r['cuda_peak_mb']:.0f} MB" if "cuda_peak_mb" in r else "")
              + f"  losses {['%.5f' % x for x in r['losses']]}")
    off, on = res["off"], res["on"]
    key = "cuda_peak_mb" if "cuda_peak_mb" in off else "step_peak_mb"
    print(f"training-step peak lower by {100 * (1 - on[key] / off[key]):.1f} %  (goal >= 45 %); "
          f"process peak lower by {100 * (1 - on['peak_mb'] / off['peak_mb']):.1f} %; memory held "
          f"between forward and backward lower by {100 * (1 - on['held_mb'] / off['held_mb']):.1f} %; "
          f"same losses: {on['losses'] == off['losses']}; {common.load()}")


if __name__ == "__main__":
    main()
