"""The models' catalog describes exactly the zoo's architectures and lists the shipped checkpoints."""
from audit.models.catalog import ARCHITECTURES, SHIPPED, available_checkpoints
from audit.models.zoo import ARCHS


def test_every_architecture_is_described_once_and_the_zoo_takes_its_words():
    assert list(ARCHITECTURES) == list(ARCHS)
    assert all(ARCHS[name].description == text for name, text in ARCHITECTURES.items())


def test_the_shipped_checkpoints_are_listed_with_their_metadata():
    shipped = available_checkpoints()
    assert {"cnn-sgd", "cnn-bort"} <= set(shipped)
    for name, meta in shipped.items():
        assert (SHIPPED / f"{name}.pt").is_file() and meta["arch"] in ARCHITECTURES, name
