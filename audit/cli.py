"""Command line: ``attribution-audit`` (= ``python -m audit``).

The top of the import layers: the only module that calls both the runner and the report builder.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attributions.errors import ToolkitError, unknown_name
from audit.errors import ConfigError

# Only light modules are imported here: --help, and the parsers of the commands that compute nothing, answer
# without importing torch; each command imports what it needs.
# The main job: cnn-sgd against its Bort twin cnn-bort and (for data randomization) its shipped permuted-label
# twin, on the embedded Fashion-MNIST sample, with the checks of the source papers (Sixt et al.: CSC, random logit,
# cascading randomization; Adebayo et al.: cascading, independent and data randomization). The methods are one of
# each family and of each failure mechanism the verdict names, plus those the papers' tables report, and the two
# controls; `--methods all` audits every method that fits a CNN.
DEMO_METHODS = ["gradient", "smoothgrad", "integrated-gradients", "input-x-gradient", "guided-backprop", "rectgrad",
                "grad-cam", "guided-grad-cam", "deeplift", "deeplift-ablation", "lrp-epsilon", "lrp-zplus", "edge",
                "random"]
DEMO: dict[str, Any] = dict(models=["cnn-sgd", "cnn-bort"], methods=DEMO_METHODS,
                            tests=["csc", "random-logit", "cascading", "independent", "data-randomization"],
                            n_images=16, max_images=64)


def demo_methods(choice: str) -> list[str]:
    """The demo's methods: its default list, or for "all" every method that applies to a CNN (not the maps read
    from attention, and not SmoothGrad over integrated gradients: 2,500 passes per map)."""
    if choice != "all":
        raise ConfigError(f"--methods takes 'all' (or leave it out for the demo's {len(DEMO_METHODS)} methods), "
                          f"not {choice!r}")
    from attributions.catalog import ABOUT, ATTENTION
    return [m for m, about in ABOUT.items() if m not in ("smoothgrad-ig", "vit-grad-cam") and about.family != ATTENTION]


def run_demo(out: str = "demo-output", seed: int = 0, progress: bool = True, methods: list[str] | None = None) -> Path:
    """Run the demo audit into ``out`` (replacing an earlier demo there), write its report, print a summary.

    Parameters
    ----------
    out : str
        The run's folder; an earlier demo there is replaced.
    seed : int
        The audit's seed.
    progress : bool
        Show a line per unit and per report stage.
    methods : list of str, optional
        The methods to audit; default :data:`DEMO_METHODS`.

    Returns
    -------
    Path
        The report's ``index.html``.
    """
    import pandas as pd

    from audit.run import load_config, run_audit
    from reports import build_report
    from reports.verdict import summary_line

    start = time.perf_counter()
    folder = Path(out)
    if (folder / "manifest.json").exists():
        shutil.rmtree(folder)
    settings = DEMO | ({"methods": methods} if methods is not None else {})
    result = run_audit(load_config(seed=seed, **settings), folder, progress=progress)
    tex = shutil.which("pdflatex") is not None and shutil.which("bibtex") is not None
    index = build_report(result.out, pdf=tex, progress=progress)
    verdict = pd.read_csv(index.with_name("verdict.csv"), keep_default_na=False)  # the report's verdict, not recomputed
    print(f"\n{summary_line(verdict)}")
    print(f"demo finished in {time.perf_counter() - start:.0f} s")
    print(f"report: {index.resolve()}")
    print(f"pdf: {index.with_name('report.pdf').resolve()}" if tex else
          "pdf: not built (no pdflatex; apt-get install texlive-latex-recommended); the LaTeX sources are beside the report")
    return index


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"expected a number or 'adaptive', got {text!r}") from None


FIT_ACCURACY = 0.95  # Adebayo et al. (2018, section 5) trained their permuted-label models to above 95 % accuracy


def _fit_accuracy(given: str | None, permute_labels: int | None) -> float | None:
    """``--fit-accuracy``: a number in (0, 1], or "off"; not given, :data:`FIT_ACCURACY` for a permuted-label twin
    and off for another model."""
    if given is None:
        return FIT_ACCURACY if permute_labels is not None else None
    if given == "off":
        return None
    try:
        value = float(given)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 1:
        raise ConfigError(f"--fit-accuracy must be in (0, 1] or 'off', got {given!r}")
    return value


def _train(args: argparse.Namespace) -> int:
    from audit.models import OPTIMIZERS, TrainConfig, train
    from audit.run.distributed import launch, sharded
    if args.workers != 1 and "WORLD_SIZE" not in os.environ:  # start the ranks; each runs this command
        return launch(args.workers, _without_workers(args.argv))
    arch_options = {"batch_norm": True} if args.batch_norm else {}
    amplitude = args.amplitude if args.amplitude in (None, "adaptive") else _number(args.amplitude)
    options = {k: v for k, v in (("gamma", args.gamma), ("amplitude", amplitude), ("mode", args.bort_mode))
               if v is not None}
    if options and not getattr(OPTIMIZERS.get(args.optimizer), "constrained", False):
        raise ConfigError(f"--gamma / --amplitude / --bort-mode need --optimizer bort or bort-adamw, "
                          f"not {args.optimizer!r}")
    if args.model is not None and (args.arch is not None or args.batch_norm):
        raise ConfigError("--model trains that model's architecture: drop --arch / --batch-norm (zoo architectures)")
    if args.control is not None and args.permute_labels is not None:
        raise ConfigError("--control trains the control twin on the true labels: drop --permute-labels")
    if args.control is not None and args.twin_of is None:
        raise ConfigError("--control SEED trains the control twin of a model: add --twin-of MODEL")
    if args.pairs is not None and (args.twin_of is None or args.control is not None or args.permute_labels is not None
                                   or args.pairs < 1):
        raise ConfigError("--pairs N trains N permuted-label twins and their control twins of --twin-of MODEL, "
                          "their seeds its own: give --twin-of, N >= 1, and neither --permute-labels nor --control")
    if args.shortcut is not None and (args.control is not None or args.permute_labels is not None
                                      or args.pairs is not None):
        raise ConfigError("--shortcut SPEC trains a shortcut twin and its tag control twin on the true labels: drop "
                          "--permute-labels, --control and --pairs")
    if args.twin_of is not None and args.control is None and args.permute_labels is None and args.pairs is None \
            and args.shortcut is None:
        raise ConfigError(f"--twin-of {args.twin_of} trains a twin: add --permute-labels SEED (the permuted-label "
                          "twin), --control SEED (its control twin on the true labels), --pairs N (N of each) or "
                          "--shortcut SPEC (a shortcut twin and its tag control twin)")
    config = TrainConfig(arch=args.arch or "cnn", optimizer=args.optimizer, epochs=args.epochs,
                         batch_size=args.batch_size, lr=args.lr, momentum=args.momentum,
                         weight_decay=args.weight_decay, seed=args.seed if args.control is None else args.control,
                         subset_seed=args.subset_seed, data=args.data, data_root=args.data_root,
                         download=args.download, train_limit=args.train_limit, arch_options=arch_options,
                         options=options, dbort=args.dbort, schedule=args.schedule, permute_labels=args.permute_labels,
                         twin_of=args.twin_of, fit_accuracy=_fit_accuracy(args.fit_accuracy, args.permute_labels),
                         model=args.model, num_classes=args.num_classes, preprocess=args.preprocess,
                         loader_workers=args.loader_workers, device=args.device,
                         mixed_precision=args.mixed_precision, shortcut=args.shortcut)
    runs = shortcut_pair(config, args.out) if args.shortcut is not None else [(config, args.out)] \
        if args.pairs is None else twin_pairs(config, args.out, args.pairs, args.subset_seed, args.fit_accuracy)
    with sharded(args.device):
        for cfg, out in runs:
            train(cfg, out=out, resume=args.resume, progress=not args.quiet, force=args.force,
                  save_every=args.save_every)
    if args.pairs is not None:
        twins, controls = (",".join(f"MODEL={out}" for cfg, out in runs if (cfg.permute_labels is None) == control)
                           for control in (False, True))
        print(f"{args.pairs} twin pairs of {args.twin_of}; audit with --twins {twins} --controls {controls} (MODEL: "
              "the model as the run names it)")
    if args.shortcut is not None:
        from audit.models import load_checkpoint
        from audit.models.shortcut_twins import gate
        checked = gate(*(getattr(load_checkpoint(out), "metadata", {}) for _, out in runs))
        print(f"shortcut twins {runs[0][1]} and {runs[1][1]}: {checked.text}"
              + ("; the shortcut is planted" if checked.planted else "; the check will call them inconclusive: train "
                 "longer (--epochs), tag more of the class (share=), or, for a head that averages over positions (global "
                 "pooling, a class token), relabel a few of the other classes' tagged images (relabel=0.02)"))
    return 0


def shortcut_pair(config: Any, out: str) -> list[tuple[Any, str]]:
    """The two trainings of ``train --shortcut``, each (TrainConfig, checkpoint path): the shortcut twin (the run's
    seed) and its tag control twin (the next seed; the tagged images drawn with it), on one training subset (the
    given ``subset_seed``, else the run's seed); paths ``OUT-shortcut.pt`` and ``OUT-tag-control.pt``."""
    stem = str(out).removesuffix(".pt")
    shared = dataclasses.replace(config, subset_seed=config.seed if config.subset_seed is None else config.subset_seed)
    return [(dataclasses.replace(shared, shortcut_role="shortcut"), f"{stem}-shortcut.pt"),
            (dataclasses.replace(shared, seed=config.seed + 1, shortcut_role="tag-control"), f"{stem}-tag-control.pt")]


def twin_pairs(config: Any, out: str, pairs: int, subset_seed: int | None, fit: str | None) -> list[tuple[Any, str]]:
    """The ``pairs`` x 2 trainings of ``train --pairs``, each (TrainConfig, checkpoint path): pair k's permuted-label
    twin (labels permuted with seed k, initial weights seed 2k - 1) and its control twin (seed 2k), both on the same
    subset (``subset_seed``, default 0), as the shipped pairs, each with its role's ``--fit-accuracy`` (``fit``);
    paths ``OUT-permuted-k.pt`` and ``OUT-control-k.pt``."""
    stem = str(out).removesuffix(".pt")
    shared = dataclasses.replace(config, subset_seed=0 if subset_seed is None else subset_seed)
    return [run for k in range(1, pairs + 1) for run in (
        (dataclasses.replace(shared, seed=2 * k - 1, permute_labels=k, fit_accuracy=_fit_accuracy(fit, k)),
         f"{stem}-permuted-{k}.pt"),
        (dataclasses.replace(shared, seed=2 * k, permute_labels=None, fit_accuracy=_fit_accuracy(fit, None)),
         f"{stem}-control-{k}.pt"))]


def _models(args: argparse.Namespace) -> int:
    from audit.models.catalog import ARCHITECTURES, available_checkpoints
    print("architectures (audit.models.build):")
    for name, description in ARCHITECTURES.items():
        print(f"  {name:10s} {description}")
    print("shipped checkpoints (audit.models.load_checkpoint):")
    shipped = available_checkpoints()
    for name, meta in shipped.items():
        print(f"  {name:12s} {meta['arch']:7s} {meta['optimizer']:10s} test accuracy {meta['test_accuracy']:.4f} "
              f"({meta['data']['name']}, {meta['epochs']} epochs)")
    if not shipped:
        print("  (none yet)")
    return 0


def _retrain_shipped(args: argparse.Namespace) -> int:
    from audit.models import SHIPPED, train
    from audit.models.recipes import RECIPES
    names = args.names or list(RECIPES)
    for name in names:
        if name not in RECIPES:
            raise unknown_name("shipped checkpoint", name, RECIPES, ConfigError)
    out_dir = args.out_dir or str(SHIPPED)
    for name in names:
        print(f"== {name}", flush=True)
        train(RECIPES[name], out=f"{out_dir}/{name}.pt", resume=True, progress=not args.quiet, force=True)
    return 0


def _demo(args: argparse.Namespace) -> int:
    methods = demo_methods(args.methods) if args.methods is not None else None
    run_demo(out=args.out, seed=args.seed, progress=not args.quiet, methods=methods)
    return 0


def _run(args: argparse.Namespace) -> int:
    from audit.checks import check_options
    from audit.run import load_config, run_audit
    from audit.run.config import general_keys
    from audit.run.distributed import launch, sharded
    from reports import build_report
    if args.workers != 1 and "WORLD_SIZE" not in os.environ:  # start the ranks; each runs this command
        return launch(args.workers, _without_workers(args.argv))
    options = {name: getattr(args, name) for name in check_options()}
    general = {f.name: getattr(args, f.name) for f in general_keys()}
    config = load_config(args.config, **general, **options)
    with sharded(config.device) as shard:
        result = run_audit(config, args.out, resume=args.resume, progress=not args.quiet, shard=shard)
    if shard.lead and args.report:
        print(f"report: {build_report(result.out, progress=not args.quiet)}")
    elif shard.lead:
        print(f"results: {result.out / 'results'} (the report: attribution-audit report {result.out})")
    return 0


def _without_workers(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--workers":
            skip = True
        elif not a.startswith("--workers="):
            out.append(a)
    return out


def _report(args: argparse.Namespace) -> int:
    from reports import build_report
    index = build_report(args.dir, args.out, pdf=args.pdf, score=args.score, progress=True)
    print(f"report: {index}")
    if args.pdf:
        print(f"pdf: {index.with_name('report.pdf')}")
    return 0


def _methods(args: argparse.Namespace) -> int:
    from attributions.catalog import ABOUT, by_family
    from reports.references import short
    for family, names in by_family(ABOUT).items():  # the catalog's words: no rule built, no torch imported
        print(f"{family}:")
        for name in names:
            cites = "; ".join(f"{short(k)} [{k}]" for k in ABOUT[name].cite)
            print(f"  {name:24s} {ABOUT[name].description} ({cites})")
    return 0


COMPUTING = ("train", "retrain-shipped", "demo", "run", "report")  # the commands that compute (torch imported)


def parser(command: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attribution-audit", allow_abbrev=False,
                                description="Audit attribution methods: rank-1 collapse, random-logit and "
                                            "parameter-randomization sanity checks, Bort-trained models.")
    p.add_argument("--debug", action="store_true", help="show the full traceback of an error")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (_train_parser, _listing_parsers, _report_parser):
        add(sub)
    _run_parser(sub, flags=command in (None, "run"))
    return p


def _train_model_arguments(t: argparse.ArgumentParser) -> None:
    """None; adds to ``t`` the options that choose the model trained and how an image folder's files reach it."""
    t.add_argument("--arch", default=None, help="a zoo architecture: cnn (default), vgg, resnet, vit, vgg16, resnet50")
    t.add_argument("--model", default=None, metavar="SPEC",
                   help="train this model's architecture from fresh weights instead of a zoo one: timm:NAME, "
                   "torchvision:NAME, hf:FOLDER, module:factory or a checkpoint (as run --models takes them); the "
                   "checkpoint loads as that model, e.g. in run --twins")
    t.add_argument("--num-classes", type=int, default=None, help="the classes of the model's head (default: the "
                   "data's; given, it must be the data's)")
    t.add_argument("--preprocess", default="none", help="how an image folder's files become inputs: none (default) "
                   "or imagenet (resize 256, centre crop 224, ImageNet mean/std), as run --preprocess")
    t.add_argument("--loader-workers", type=int, default=0, metavar="N",
                   help="processes that read an image folder's batches (default 0: the training process); the "
                   "folder is read batch by batch, never held in memory, and the weights do not depend on N")
    t.add_argument("--batch-norm", action="store_true", help="vgg with BatchNorm")


def _train_recipe_arguments(t: argparse.ArgumentParser) -> None:
    """None; adds to ``t`` the training recipe: optimizer, hyperparameters, data, schedule and the Bort settings."""
    t.add_argument("--optimizer", default="sgd", help="sgd, adamw (and the registered ones)")
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=None, help="default: the optimizer's")
    t.add_argument("--momentum", type=float, default=0.9)
    t.add_argument("--weight-decay", type=float, default=None, help="default: the optimizer's")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--data", default="fashion-mnist",
                   help="fashion-mnist, mnist, cifar10, imagefolder (streamed from --data-root), fashion-mnist-sample")
    t.add_argument("--data-root", default=None, help="folder looked in first; for imagefolder the folder, with one "
                   "sub-folder per class, or train/ and test/ folders each with one")
    t.add_argument("--download", action="store_true", help="fetch the official files when missing")
    t.add_argument("--train-limit", type=int, default=None, help="train on a seeded subset of N images")
    t.add_argument("--schedule", default="constant", help="constant or cosine")
    t.add_argument("--gamma", type=float, default=None, help="Bort: correction strength (default 0.05)")
    t.add_argument("--amplitude", default=None, help="Bort: c in W W^T = c I, a number or 'adaptive' (default 1)")
    t.add_argument("--bort-mode", default=None, help="Bort: l2-full, l1-full-row (default), l1-full-col, "
                                                     "l2-row, l2-col, l1-row, l1-col")
    t.add_argument("--dbort", action="store_true", help="add DBort's auxiliary loss")


def _train_twin_arguments(t: argparse.ArgumentParser) -> None:
    """None; adds to ``t`` the options that train a twin: permuted labels, the fit target, the control twin."""
    t.add_argument("--permute-labels", type=int, default=None, metavar="SEED",
                   help="train on the training labels permuted once with this seed: the permuted-label twin of the "
                   "data-randomization test (with --train-limit and enough --epochs to fit them)")
    t.add_argument("--fit-accuracy", default=None, metavar="ACCURACY",
                   help="stop once the accuracy on the training labels (eval mode, after an epoch) reaches this, or "
                   "'off'; a model below it after --epochs is saved, recorded as not fitting (an audit flags it) and "
                   f"the command fails (default: {FIT_ACCURACY} for a permuted-label twin, as Adebayo et al.; off "
                   "otherwise)")
    t.add_argument("--control", type=int, default=None, metavar="SEED",
                   help="train the control twin (with --twin-of): the permuted-label twin's recipe on the true labels "
                   "from initial weights of this seed, the reference of the calibrated data-randomization verdict; "
                   "give it the twin's --train-limit, --subset-seed, --epochs and settings")
    t.add_argument("--pairs", type=int, default=None, metavar="N",
                   help="train N pairs of a permuted-label twin and its control twin of --twin-of (pair k: labels "
                   "permuted with seed k, initial weights seeds 2k - 1 and 2k, one --subset-seed), saved as "
                   "OUT-permuted-k.pt and OUT-control-k.pt: the twins are draws too, and the audit resamples the pairs")
    t.add_argument("--shortcut", default=None, metavar="SPEC",
                   help="train a shortcut twin (the tag on a share of its class's training images) and its tag "
                   "control twin (the tag on as many images of every class; the next seed) of this architecture, as "
                   "OUT-shortcut.pt and OUT-tag-control.pt, for --tests shortcut; SPEC: class=0,pattern=checker,"
                   "size=4,place=top-left,share=0.5,relabel=0 (every key optional; pattern checker, white or black; "
                   "place a corner, centre or ROW:COL; relabel: the share of the other classes' images the shortcut "
                   "twin sees tagged and labelled as the class)")
    t.add_argument("--subset-seed", type=int, default=None, metavar="SEED",
                   help="seeds the --train-limit subset (default: --seed); a permuted-label twin and its control "
                   "twin share it")
    t.add_argument("--twin-of", default=None, metavar="MODEL", help="the model this run is a twin of (with "
                   "--permute-labels or --control): a checkpoint (shipped name or .pt path) or a model specification; "
                   "its architecture must match, tensor by tensor; recorded in the metadata")


def _train_run_arguments(t: argparse.ArgumentParser) -> None:
    """None; adds to ``t`` where the checkpoint goes and how the run executes (resume, workers, device)."""
    t.add_argument("--out", required=True, help="checkpoint path (.pt; metadata beside it as .json)")
    t.add_argument("--resume", action="store_true", help="continue from the resume state beside --out")
    t.add_argument("--save-every", type=int, default=None, metavar="STEPS",
                   help="also save the resume state every STEPS optimizer steps within an epoch (default: after each "
                   "epoch only); --resume then continues from the last saved step, with the weights of an "
                   "uninterrupted run")
    t.add_argument("--workers", type=int, default=1, metavar="N",
                   help="train in N processes on this machine with DistributedDataParallel (gloo): each global batch "
                   "of --batch-size images is shared out over the ranks, rank 0 writes; the same weights as one "
                   "process to float rounding (without BatchNorm or dropout). On a cluster: torchrun --nnodes ... "
                   "-m audit train ...")
    t.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to train (default cpu); with "
                   "--workers or torchrun on cuda, each rank on its LOCAL_RANK's GPU, NCCL between them")
    t.add_argument("--mixed-precision", action="store_true", help="forward passes under autocast (bfloat16 on the cpu, "
                   "float16 with a gradient scaler on a GPU); the weights and the optimizer stay float32")
    t.add_argument("--force", action="store_true", help="overwrite an existing checkpoint at --out")
    t.add_argument("--quiet", action="store_true", help="no progress bars")


def _train_parser(sub: Any) -> None:
    t = sub.add_parser("train", allow_abbrev=False, help="train a model (a zoo architecture, or any model an audit "
                       "takes, e.g. the twins of yours) and save a checkpoint (.pt + .json)")
    _train_model_arguments(t)
    _train_recipe_arguments(t)
    _train_twin_arguments(t)
    _train_run_arguments(t)
    t.set_defaults(func=_train)


def _listing_parsers(sub: Any) -> None:
    m = sub.add_parser("models", allow_abbrev=False, help="list architectures and shipped checkpoints")
    m.set_defaults(func=_models)

    r = sub.add_parser("retrain-shipped", allow_abbrev=False,
                       help="retrain the shipped checkpoints from their recipes (resumable)")
    r.add_argument("names", nargs="*", help="default: all")
    r.add_argument("--out-dir", default=None, help="default: the package's checkpoint folder")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=_retrain_shipped)

    d = sub.add_parser("demo", allow_abbrev=False, help="the audit of cnn-sgd against its Bort, permuted-label and "
                       "control twins on the embedded sample: the source papers' checks, a method of each family and "
                       "mechanism, 16 images and up to 64 for an undecided cell")
    d.add_argument("--out", default="demo-output")
    d.add_argument("--methods", default=None, choices=["all"],
                   help="'all': every method that applies to a CNN (default: the demo's 14)")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=_demo)


def _run_parser(sub: Any, flags: bool = True) -> None:
    """The ``run`` command; its flags (read from the configuration's and the checks' declarations, which import
    the checks and torch) only when ``flags``: the parser of another command does not need them."""
    a = sub.add_parser("run", allow_abbrev=False, help="audit models: CSC, random-logit, parameter and data "
                       "randomization, with a report")
    a.set_defaults(func=_run)
    if not flags:
        return
    from audit.run.config import general_keys
    for general in general_keys():  # every general key, as in the TOML file
        a.add_argument(f"--{general.name.replace('_', '-')}", dest=general.name, default=None,
                       help=general.metadata["help"].replace("%", "%%"), **general.metadata["flag"])
    a.add_argument("--config", default=None, help="a TOML file with the same keys (underscores)")
    a.add_argument("--out", required=True, help="the run folder (results, manifest, report)")
    a.add_argument("--workers", type=int, default=1, help="processes to shard the units over (torch.distributed, "
                   "gloo on CPU, nccl on GPU); several nodes: torchrun --nnodes ... -m audit run ...")
    a.add_argument("--resume", action="store_true", help="skip the units a previous run finished")
    a.add_argument("--no-report", dest="report", action="store_false",
                   help="write the results only; build the report later with: attribution-audit report OUT")
    a.add_argument("--quiet", action="store_true")
    _check_flags(a)


def _check_flags(a: argparse.ArgumentParser) -> None:
    """A flag per check option, from its declaration (as in the TOML file)."""
    from audit.checks import check_options
    for option in check_options().values():
        kind = type(option.default)
        flag = f"--{option.name.replace('_', '-')}"
        text = f"{option.help} (default {option.default})".replace("%", "%%")  # argparse formats help with %
        if kind is bool:  # --emprt-curve / --no-emprt-curve
            a.add_argument(flag, dest=option.name, default=None, action=argparse.BooleanOptionalAction, help=text)
            continue
        a.add_argument(flag, dest=option.name, default=None, type=kind if kind in (int, float) else str,
                       choices=option.choices or None, help=text)


def _report_parser(sub: Any) -> None:
    rp = sub.add_parser("report", allow_abbrev=False, help="rebuild the report of a finished run without recomputing")
    rp.add_argument("dir")
    rp.add_argument("--out", default=None, help="default: the run folder")
    rp.add_argument("--pdf", action="store_true", help="also compile standalone.tex to report.pdf (pdflatex, bibtex)")
    rp.add_argument("--score", default=None, help="the verdict score drawn across models (more than two models; "
                    "default: the first the run has, e.g. random_logit_ssim)")
    rp.set_defaults(func=_report)
    me = sub.add_parser("methods", allow_abbrev=False, help="list the attribution methods")
    me.set_defaults(func=_methods)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in given if not a.startswith("-")), None)
    args = parser(command or "").parse_args(given)  # "": no command given, only the list of commands
    args.argv = given
    prefix = f"attribution-audit {args.command}"
    if args.command in COMPUTING:
        from audit.run.resources import keep_freed_memory
        keep_freed_memory()  # passes over the same shapes reuse freed memory instead of faulting it in again
    try:
        result: int = args.func(args)
        return result
    except ToolkitError as exc:
        if args.debug:
            raise
        print(f"{prefix}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prefix}: interrupted; finished units and epochs are kept (--resume continues)", file=sys.stderr)
        return 130
    except OSError as exc:  # a folder that cannot be written, a file that vanished, a full disk
        if args.debug:
            raise
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        print(f"{prefix}: error: {exc.strerror or exc}{where}; check the path and its permissions", file=sys.stderr)
        return 2
    except Exception as exc:  # a bug of ours or of the user's model code: one line, the traceback on request
        if args.debug:
            raise
        print(f"{prefix}: unexpected {type(exc).__name__}: {exc} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
