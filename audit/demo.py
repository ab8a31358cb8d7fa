"""The main job: the full audit of the shipped cnn-sgd against its Bort twin cnn-bort, every
method, the three tests of Sixt et al., on the embedded Fashion-MNIST sample."""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from audit.config import load_config
from audit.runner import run_audit
from reports.verdict import verdict_table

DEMO = dict(models=["cnn-sgd", "cnn-bort"], methods="all", tests=["csc", "random-logit", "cascading"], n_images=16)


def run_demo(out: str = "demo-output", seed: int = 0, progress: bool = True) -> Path:
    """Run the demo audit into ``out`` (replacing an earlier demo there) and print the report path."""
    start = time.perf_counter()
    out = Path(out)
    if (out / "manifest.json").exists():
        shutil.rmtree(out)
    result = run_audit(load_config(seed=seed, **DEMO), out, progress=progress)
    index = result.write_report()
    verdict = verdict_table(result.tables, result.config)
    failing = verdict[verdict.verdict != "pass"]
    print(f"\n{len(verdict) - len(failing)} of {len(verdict)} model x method pairs pass all three sanity checks")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    print(f"report: {index.resolve()}")
    return index
