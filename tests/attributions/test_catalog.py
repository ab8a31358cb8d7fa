"""The catalog names exactly the methods that can be built, and every built method speaks its words."""
from attributions.catalog import ABOUT, FAMILIES
from attributions.methods import BUILDERS, build_method
from reports.references import REFERENCES


def test_the_catalog_and_the_builders_name_the_same_methods_in_the_same_order():
    assert list(ABOUT) == list(BUILDERS)


def test_each_method_takes_its_description_reference_family_and_citations_from_the_catalog():
    for name, about in ABOUT.items():
        method = build_method(name)
        assert (method.description, method.reference, method.family, method.cite) == \
            (about.description, about.reference, about.family, about.cite), name
        assert about.family in FAMILIES and set(about.cite) <= set(REFERENCES), name
