"""Method colours and families: one colour per method, the same everywhere; families complete."""
from matplotlib.colors import to_rgb

from attributions.catalog import FAMILIES
from attributions.methods import BUILDERS, build_method
from audit import style


def test_every_method_has_one_family_and_families_are_complete():
    groups = style.by_family(list(BUILDERS))
    assert list(groups) == list(FAMILIES)  # every family has members, in drawing order
    flat = [m for ms in groups.values() for m in ms]
    assert sorted(flat) == sorted(BUILDERS) and len(flat) == len(set(flat))
    assert all(style.family(m) == build_method(m).family for m in BUILDERS)
    assert set(style.members("LRP z+ family")) >= {"lrp-zplus", "lrp-alpha1beta0", "deep-taylor"}


def test_colours_are_distinct_and_do_not_depend_on_what_else_is_drawn():
    colours = {m: style.color(m) for m in BUILDERS}
    assert len(set(colours.values())) == len(BUILDERS)
    # a subset, in another order, keeps every colour
    subset = list(reversed(list(BUILDERS)))[::3]
    assert {m: style.color(m) for m in subset} == {m: colours[m] for m in subset}
    groups = style.by_family(subset)
    for name, methods in groups.items():  # registry order within a family, whatever order they came in
        assert methods == [m for m in BUILDERS if m in subset and style.family(m) == name]


def test_a_family_is_shades_of_its_hue():
    for name, hue in style.FAMILY_HUES.items():
        base = to_rgb(hue)
        for m in style.members(name):
            rgb = to_rgb(style.color(m))
            # shading toward black or white keeps the channel order of the hue
            assert sorted(range(3), key=lambda i: rgb[i]) == sorted(range(3), key=lambda i: base[i]) or \
                max(base) - min(base) < 1e-9, (name, m)
        shades = [style.color(m) for m in style.members(name)]
        markers = [style.marker(m) for m in style.members(name)]
        assert len(set(shades)) == len(shades) and len(set(markers)) == len(markers)


def test_unknown_names_are_drawn_as_controls():
    assert style.family("my-method") == "controls" and style.color("my-method").startswith("#")
