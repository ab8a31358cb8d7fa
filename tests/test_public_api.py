"""The public names of each package import directly, without lazy attribute tricks."""
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
        assert not hasattr(module, "__getattr__"), name  # no lazy module attributes
        missing = [n for n in module.__all__ if n not in vars(module)]
        assert not missing, (name, missing)


def test_every_toolkit_error_shares_one_base():
    from attributions import AttributionError, ToolkitError
    from audit import AuditError, ConfigError, DataError, ModelError
    from bort import BortError

    assert all(issubclass(e, ToolkitError) for e in (AttributionError, AuditError, ConfigError, DataError, ModelError,
                                                     BortError))
