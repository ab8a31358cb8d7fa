"""Sharded runs: 2 ranks against 1 process on the same audit (identical files, time ratio), and a
projection of a paper-scale ImageNet audit from measured per-map costs.

What is measured: wall time of ``attribution-audit run`` with ``--workers 2`` and with one process
(interleaved rounds, each including process start and the report), and seconds per map of each
method on the zoo's VGG-16 at 224 x 224 (random weights, batch 8) on this machine's CPU. What is
projected: the maps a 200-image, 21-method, 5-check audit needs (from each check's protocol), their
CPU time, and that time spread over N workers with the parallel efficiency of the units' phase
measured for 2 ranks (the whole command adds process start, model loading and the report).
GPU per-map costs are not measured here (no GPU on this machine): the projection is in CPU workers.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from attributions import Explainer
from attributions.methods import BUILDERS
from audit.models.zoo import build
from benchmarks.timing import median_times, table

AUDIT = ["--models", "cnn-sgd,cnn-bort", "--methods", "gradient,input-x-gradient,guided-backprop,lrp-epsilon,lrp-zplus,"
         "deeplift,integrated-gradients,smoothgrad", "--tests", "random-logit,cascading", "--n-images", "16", "--quiet"]


def _run(out: Path, workers: int, threads: int | None = None) -> None:
    if out.exists():
        shutil.rmtree(out)
    env = os.environ.copy() | ({"OMP_NUM_THREADS": str(threads)} if threads else {})
    subprocess.run([sys.executable, "-m", "audit", "run", *AUDIT, "--workers", str(workers), "--out", str(out)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def _tables(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "results").glob("*.csv"))}


def _unit_phase(out: Path, world: int) -> float:
    """Seconds of the units' phase: the busiest rank's sum of unit times (units are dealt round-robin
    in the run's order, as :class:`audit.run.distributed.Shard` does)."""
    manifest = json.loads((out / "manifest.json").read_text())
    config = manifest["config"]
    timings: dict[str, float] = manifest["timings_s"]
    keys = [f"{m}/{t}/{x}" for m in config["models"] for t in config["tests"] for x in config["methods"]]
    return max(sum(timings.get(k, 0.0) for i, k in enumerate(keys) if i % world == r) for r in range(world))


def ranks(rounds: int = 3) -> dict[str, float | bool]:
    """Time of 2 ranks (one thread each) over 1 process with the machine's threads and over 1 process
    with one thread (the same work, parallel only across ranks), for the whole command and for the
    units' phase; and whether the result tables of all three are byte-identical."""
    with tempfile.TemporaryDirectory() as tmp:
        one, single, two = Path(tmp) / "one", Path(tmp) / "single", Path(tmp) / "two"
        times = median_times({"one": lambda: _run(one, 1), "single": lambda: _run(single, 1, threads=1),
                              "two": lambda: _run(two, 2)}, rounds=rounds, warmup=0)
        return {"whole": times["two"] / times["one"], "phase": _unit_phase(two, 2) / _unit_phase(one, 1),
                "whole_1t": times["two"] / times["single"], "phase_1t": _unit_phase(two, 2) / _unit_phase(single, 1),
                "same": _tables(one) == _tables(two) == _tables(single)}


def seconds_per_map(methods: list[str], batch: int = 8) -> dict[str, float]:
    """Seconds per map of each method on the zoo's VGG-16 at 224 x 224 (one map per image)."""
    torch.manual_seed(0)
    model = build("vgg16", (3, 224, 224), 1000).eval()
    x = torch.rand(batch, 3, 224, 224)
    y = torch.zeros(batch, dtype=torch.long)
    out = {}
    for m in methods:
        params: dict[str, Any] = {"samples": 10} if m == "smoothgrad" else {"n_steps": 10} if m == "integrated-gradients" else {}
        ex = Explainer(model, m, **params)
        ex.attribute(x, target=y)
        start = time.perf_counter()
        ex.attribute(x, target=y)
        scale = 5 if m == "smoothgrad" else 5 if m == "integrated-gradients" else 1  # to the defaults (50 passes)
        out[m] = (time.perf_counter() - start) * scale / batch
    return out


# maps per image and method for each check on VGG-16 (16 parametrised layers): random-logit 2;
# cascading and independent randomization 1 + 16 stages; eMPRT 2 (score only); sMPRT 17 stages x
# 50 noisy copies; CSC is one backward chain per vector (5 vectors, counted as 5 maps)
MAPS_PER_IMAGE = {"random-logit": 2, "cascading": 17, "emprt": 2, "smprt": 17 * 50, "csc": 5}


def projection(per_map: dict[str, float], efficiency: float, images: int = 200) -> str:
    mean_cost = sum(per_map.values()) / len(per_map)
    maps = images * len(BUILDERS) * sum(MAPS_PER_IMAGE.values())
    cpu_hours = maps * mean_cost / 3600
    rows = [(n, f"{cpu_hours / (n * (efficiency if n > 1 else 1.0)):.1f}") for n in (1, 8, 64)]
    return (f"{maps:,} maps ({images} images x {len(BUILDERS)} methods x checks {MAPS_PER_IMAGE}); measured "
            f"mean {mean_cost:.3f} s per map (CPU, VGG-16 224, methods {', '.join(per_map)}); parallel efficiency "
            f"{efficiency:.2f} from the 2-rank run\n\n" + table(rows, ("CPU workers", "projected hours")))


def run() -> str:
    r = ranks()
    per_map = seconds_per_map(["gradient", "guided-backprop", "lrp-epsilon", "lrp-zplus", "deeplift", "smoothgrad",
                               "integrated-gradients"])
    efficiency = 1 / (2 * float(r["phase"]))
    lines = [f"2 ranks / 1 process (same audit, {' '.join(AUDIT)}), target <= 0.6x; result tables identical: "
             f"{r['same']}", "",
             table([("1 process, 2 threads", f"{r['whole']:.2f}x", f"{r['phase']:.2f}x"),
                    ("1 process, 1 thread", f"{r['whole_1t']:.2f}x", f"{r['phase_1t']:.2f}x")],
                   ("2 ranks (1 thread each) over", "whole command", "units' phase")),
             "", table([(m, f"{s:.3f}") for m, s in per_map.items()], ("method", "s per map (VGG-16 224, CPU)")),
             "", projection(per_map, efficiency)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
