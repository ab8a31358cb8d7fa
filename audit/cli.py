"""Command line: ``attribution-audit`` (= ``python -m audit``)."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from audit.errors import AuditError, ConfigError


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"expected a number or 'adaptive', got {text!r}") from None


def _train(args: argparse.Namespace) -> int:
    from audit.train import TrainConfig, train

    arch_options = {"batch_norm": True} if args.batch_norm else {}
    amplitude = args.amplitude if args.amplitude in (None, "adaptive") else _number(args.amplitude)
    options = {k: v for k, v in (("gamma", args.gamma), ("amplitude", amplitude), ("mode", args.bort_mode))
               if v is not None}
    if options and not args.optimizer.startswith("bort"):
        raise ConfigError(f"--gamma / --amplitude / --bort-mode need --optimizer bort or bort-adamw, "
                          f"not {args.optimizer!r}")
    config = TrainConfig(arch=args.arch, optimizer=args.optimizer, epochs=args.epochs, batch_size=args.batch_size,
                         lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay, seed=args.seed,
                         data=args.data, data_root=args.data_root, download=args.download,
                         train_limit=args.train_limit, arch_options=arch_options, options=options,
                         dbort=args.dbort, schedule=args.schedule)
    train(config, out=args.out, resume=args.resume, progress=not args.quiet)
    return 0


def _models(args: argparse.Namespace) -> int:
    from audit.zoo import ARCHS, available_checkpoints

    print("architectures (audit.zoo.build):")
    for name, arch in ARCHS.items():
        print(f"  {name:10s} {arch.description}")
    print("shipped checkpoints (audit.zoo.load_checkpoint):")
    shipped = available_checkpoints()
    for name, meta in shipped.items():
        print(f"  {name:12s} {meta['arch']:7s} {meta['optimizer']:10s} test accuracy {meta['test_accuracy']:.4f} "
              f"({meta['data']['name']}, {meta['epochs']} epochs)")
    if not shipped:
        print("  (none yet)")
    return 0


def _retrain_shipped(args: argparse.Namespace) -> int:
    from audit.train import train
    from audit.zoo.checkpoint import SHIPPED
    from audit.zoo.recipes import RECIPES

    names = args.names or list(RECIPES)
    for name in names:
        if name not in RECIPES:
            from audit.errors import unknown_name
            raise unknown_name("shipped checkpoint", name, RECIPES)
    out_dir = args.out_dir or str(SHIPPED)
    for name in names:
        print(f"== {name}", flush=True)
        train(RECIPES[name], out=f"{out_dir}/{name}.pt", resume=True, progress=not args.quiet)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from audit.demo import run_demo

    run_demo(out=args.out, seed=args.seed, progress=not args.quiet)
    return 0


def _run(args: argparse.Namespace) -> int:
    from audit.config import load_config
    from audit.runner import run_audit

    config = load_config(args.config, models=args.models, methods=args.methods, tests=args.tests,
                         n_images=args.n_images, seed=args.seed, device=args.device, data=args.data,
                         data_root=args.data_root, weights=args.weights)
    result = run_audit(config, args.out, resume=args.resume, progress=not args.quiet)
    print(f"report: {result.write_report()}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from reports import build_report

    print(f"report: {build_report(args.dir, args.out)}")
    return 0


def _methods(args: argparse.Namespace) -> int:
    from attributions import available_methods

    for name, text in available_methods().items():
        print(f"  {name:24s} {text}")
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attribution-audit",
                                description="Audit attribution methods: rank-1 collapse, random-logit and "
                                            "parameter-randomization sanity checks, Bort-trained models.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a zoo model and save a checkpoint (.pt + .json)")
    t.add_argument("--arch", default="cnn", help="cnn, vgg, resnet, vgg16, resnet50")
    t.add_argument("--batch-norm", action="store_true", help="vgg with BatchNorm")
    t.add_argument("--optimizer", default="sgd", help="sgd, adamw (and the registered ones)")
    t.add_argument("--epochs", type=int, default=10)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=None, help="default: the optimizer's")
    t.add_argument("--momentum", type=float, default=0.9)
    t.add_argument("--weight-decay", type=float, default=None, help="default: the optimizer's")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--data", default="fashion-mnist",
                   help="fashion-mnist, mnist, cifar10, imagefolder, fashion-mnist-sample")
    t.add_argument("--data-root", default=None, help="folder looked in first")
    t.add_argument("--download", action="store_true", help="fetch the official files when missing")
    t.add_argument("--train-limit", type=int, default=None, help="train on a seeded subset of N images")
    t.add_argument("--schedule", default="constant", help="constant or cosine")
    t.add_argument("--gamma", type=float, default=None, help="Bort: correction strength (default 0.05)")
    t.add_argument("--amplitude", default=None, help="Bort: c in W W^T = c I, a number or 'adaptive' (default 1)")
    t.add_argument("--bort-mode", default=None, help="Bort: l2-full, l1-full-row (default), l1-full-col, "
                                                     "l2-row, l2-col, l1-row, l1-col")
    t.add_argument("--dbort", action="store_true", help="add DBort's auxiliary loss")
    t.add_argument("--out", required=True, help="checkpoint path (.pt; metadata beside it as .json)")
    t.add_argument("--resume", action="store_true", help="continue from the per-epoch state beside --out")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=_train)

    m = sub.add_parser("models", help="list architectures and shipped checkpoints")
    m.set_defaults(func=_models)

    r = sub.add_parser("retrain-shipped", help="retrain the shipped checkpoints from their recipes (resumable)")
    r.add_argument("names", nargs="*", help="default: all")
    r.add_argument("--out-dir", default=None, help="default: the package's checkpoint folder")
    r.add_argument("--quiet", action="store_true")
    r.set_defaults(func=_retrain_shipped)

    d = sub.add_parser("demo", help="the full audit of cnn-sgd against cnn-bort on the embedded sample")
    d.add_argument("--out", default="demo-output")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=_demo)

    a = sub.add_parser("run", help="audit models: CSC, random-logit and parameter randomization, with a report")
    a.add_argument("--models", default=None, help="comma-separated: shipped names, checkpoint paths, module:factory")
    a.add_argument("--weights", default=None, help="state_dict for a module:factory model")
    a.add_argument("--methods", default=None, help='comma-separated method names, or "all"')
    a.add_argument("--tests", default=None, help="comma-separated: csc, random-logit, cascading, independent, bottom-up")
    a.add_argument("--n-images", type=int, default=None)
    a.add_argument("--data", default=None, help='"embedded" (default) or a data set name')
    a.add_argument("--data-root", default=None)
    a.add_argument("--config", default=None, help="a TOML file with the same keys (underscores)")
    a.add_argument("--seed", type=int, default=None)
    a.add_argument("--device", default=None, choices=["cpu", "cuda"])
    a.add_argument("--out", required=True, help="the run folder (results, manifest, report)")
    a.add_argument("--resume", action="store_true", help="skip the units a previous run finished")
    a.add_argument("--quiet", action="store_true")
    a.set_defaults(func=_run)

    rp = sub.add_parser("report", help="rebuild the report of a finished run without recomputing")
    rp.add_argument("dir")
    rp.add_argument("--out", default=None, help="default: the run folder")
    rp.set_defaults(func=_report)

    me = sub.add_parser("methods", help="list the attribution methods")
    me.set_defaults(func=_methods)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except AuditError as exc:
        print(f"attribution-audit {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
