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
