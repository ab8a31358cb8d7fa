"""Package attributes imported on first use, so that importing a package (the command line's ``--help``) does not
import torch and every module below it."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level ``__getattr__`` and ``__dir__`` (PEP 562) for ``names``: {attribute: the module that
    defines it}; any other attribute is looked up as a submodule of ``package``."""
    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is not None:
            return getattr(importlib.import_module(module), name)
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":  # a missing module the submodule imports: its own error
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    def __dir__() -> list[str]:  # what is bound already (submodules imported, names used), and what will be
        return sorted(set(vars(sys.modules[package])) | set(names) | set(getattr(sys.modules[package], "__all__", ())))
    return __getattr__, __dir__
