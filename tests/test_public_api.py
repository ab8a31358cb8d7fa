"""The public names of each package: every name in ``__all__`` is there (a package may import it on first use, so
that importing the package does not import torch), and ``dir()`` lists it."""
import importlib


def test_bort_exports_its_optimizers_and_metrics():
    from bort import Bort, BortAdamW, BortError, constraint_error, dbort_loss, param_groups

    assert issubclass(Bort, importlib.import_module("torch").optim.Optimizer) and issubclass(BortAdamW, Bort.__base__)
    assert callable(constraint_error) and callable(dbort_loss) and callable(param_groups)
    assert issubclass(BortError, importlib.import_module("attributions").ToolkitError)


def test_every_name_in_all_is_a_real_attribute():
    for name in ("attributions", "bort", "audit", "audit.checks", "audit.measures", "audit.data", "audit.models",
                 "audit.run", "reports"):
        module = importlib.import_module(name)
        missing = [n for n in module.__all__ if getattr(module, n, None) is None]
        assert not missing, (name, missing)
        assert set(module.__all__) <= set(dir(module)), name


def test_every_toolkit_error_shares_one_base():
    from attributions import AttributionError, ToolkitError
    from audit import AuditError, ConfigError, DataError, ModelError
    from bort import BortError

    assert all(issubclass(e, ToolkitError) for e in (AttributionError, AuditError, ConfigError, DataError, ModelError,
                                                     BortError))


MAX_POSITIONAL = 6  # past six, a call reads as a row of values whose meaning is their place: the rest go by keyword


def test_no_public_function_takes_more_than_six_positional_parameters():
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    over = []
    for package in ("attributions", "audit", "reports", "bort", "benchmarks"):
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
                    positional = [a.arg for a in (*node.args.posonlyargs, *node.args.args) if a.arg not in ("self", "cls")]
                    if len(positional) > MAX_POSITIONAL:
                        over.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({len(positional)})")
    assert not over, "make the parameters after the sixth keyword-only (*):\n" + "\n".join(over)


PUBLIC = ("attributions", "bort", "audit", "audit.checks", "audit.measures", "audit.data", "audit.models", "audit.run",
          "reports")


def _public_objects() -> dict[str, object]:
    """{qualified name: object} of every function and class the packages' ``__all__`` name, and the public methods
    a (non-dataclass) class defines itself."""
    import dataclasses
    import inspect

    found: dict[str, object] = {}
    for package in PUBLIC:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)):
                continue
            qualified = f"{obj.__module__}.{obj.__qualname__}"
            found[qualified] = obj
            if inspect.isclass(obj) and not dataclasses.is_dataclass(obj):
                found |= {f"{qualified}.{n}": f for n, f in vars(obj).items()
                          if not n.startswith("_") and inspect.isfunction(f)}
    return found


def test_the_public_api_documents_every_parameter_as_numpydoc_reads_it():
    """numpydoc's validator (the linter numpydoc-styled projects run) on every public function, class and method:
    no parameter undocumented (PR01) and none documented that the signature lacks (PR02). A dataclass's fields
    count as documented in its Attributes section or by a declaration's own ``help`` (one declaration for the
    command line, the TOML file and the docs); a parameter named with a leading underscore is not public."""
    import dataclasses
    import inspect

    from numpydoc.docscrape import NumpyDocString
    from numpydoc.validate import validate

    problems = []
    for qualified, obj in _public_objects().items():
        errors = [(code, text) for code, text in validate(qualified)["errors"] if code in ("PR01", "PR02")]
        if dataclasses.is_dataclass(obj) and errors:
            doc = NumpyDocString(inspect.getdoc(obj) or "")
            documented = {n.strip() for p in [*doc["Attributes"], *doc["Parameters"]] for n in p.name.split(",")}
            fields = {f.name for f in dataclasses.fields(obj) if f.init and "help" not in f.metadata}
            errors = [("PR01", f"fields {sorted(fields - documented)} not documented")] if fields - documented else []
        errors = [(c, t) for c, t in errors if not (c == "PR01" and all(  # "Parameters {'a', '_b'} not documented"
            name.strip(" '").startswith("_") for name in t[t.find("{") + 1:t.find("}")].split(",")))]
        problems += [f"{qualified}: {code} {text}" for code, text in errors]
    assert not problems, "\n".join(problems)
