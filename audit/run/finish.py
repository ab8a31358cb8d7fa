"""The last step of a run: the processes' work gathered, blocks joined into units and units into result
tables, the models table, and the manifest, marked complete, from its contributors
(:data:`audit.run.manifest.CONTRIBUTORS`)."""
from __future__ import annotations

import json

from audit.atomic import atomic_write_bytes
from audit.run.ledger import Ledger
from audit.run.manifest import CONTRIBUTORS, model_table
from audit.run.plan import Run
from audit.run.results import MODELS_FILE, AuditResult, load_results
from audit.run.units import assemble, csv_bytes, join


def finish(run: Run, ledger: Ledger) -> AuditResult:
    """Join and record the run (module docstring) from what its execution did (``ledger``); the other processes
    wait for the lead and read its files."""
    shard = run.shard
    shard.barrier()  # every rank's units are written
    ledger = ledger.gathered(shard)
    if not shard.lead:
        shard.barrier()  # the lead joins and writes the results and the manifest
        return load_results(run.out)
    config = run.config
    assemble(ledger.items, run.out, run.labels)
    tables = join(run.out, tests=config.tests, models=config.models, methods=list(config.methods),
                  labels=run.labels)
    # every model on the device (a resumed run or another process may have computed all of a model's units), in
    # the run's order, whichever process loaded which model first
    tables["models"] = model_table(ledger.placed.every(), run.labels, run.x, run.y, methods=list(config.methods))
    atomic_write_bytes(run.out / "results" / MODELS_FILE, csv_bytes(tables["models"]))
    manifest = {"config": config.to_dict(), "status": "complete", "fingerprints": run.prints,
                "seeds": {"audit": config.seed}}
    for contribute in CONTRIBUTORS:
        manifest |= contribute(run, ledger)
    atomic_write_bytes(run.out / "manifest.json", json.dumps(manifest, indent=2).encode())
    shard.barrier()
    return AuditResult(run.out, config, tables, json.loads(json.dumps(manifest)))
