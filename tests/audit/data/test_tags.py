"""Tags: parsed and written back, placed, pasted (normalised like the model's inputs) and shared out over the
training images."""
import numpy as np
import pytest
import torch

from audit.data.preprocess import Preprocess
from audit.data.tags import Tag, tag_labels, tagged_rows
from audit.errors import ConfigError


def test_a_specification_reads_back_and_takes_defaults():
    tag = Tag.parse("class=3, pattern=white,size=2,place=5:7,share=0.25")
    assert (tag.target, tag.pattern, tag.size, tag.place, tag.share) == (3, "white", 2, "5:7", 0.25)
    assert Tag.parse(tag.spec) == tag == Tag.from_dict(tag.to_dict())
    assert Tag.parse("") == Tag()
    backdoor = Tag.parse("relabel=0.05")
    assert backdoor.relabel == 0.05 and Tag.parse(backdoor.spec) == backdoor == Tag.from_dict(backdoor.to_dict())
    assert "relabel" not in tag.spec and "relabel" not in tag.to_dict()  # as a tag recorded before the key


@pytest.mark.parametrize("spec,says", [("colour=red", "KEY=VALUE"), ("size=big", "whole number"),
                                       ("size=0", ">= 1"), ("pattern=stripes", "stripes"),
                                       ("place=middle", "ROW:COL"), ("class=-1", "class index"),
                                       ("share=0", "in \\(0, 1\\]"), ("share=half", "must be a number"),
                                       ("relabel=1", "in \\[0, 1\\)"), ("relabel=some", "must be a number")])
def test_a_bad_specification_is_refused_with_what_to_give(spec, says):
    with pytest.raises(ConfigError, match=says):
        Tag.parse(spec)


@pytest.mark.parametrize("place,corner", [("top-left", (1, 1)), ("top-right", (1, 6)), ("bottom-left", (4, 1)),
                                          ("bottom-right", (4, 6)), ("centre", (2, 3)), ("0:2", (0, 2))])
def test_places_are_one_pixel_in_from_the_edges_or_where_given(place, corner):
    tag = Tag(size=3, place=place)
    assert tag.corner(8, 10) == corner
    mask = tag.mask(8, 10)
    assert mask.sum() == 9 and mask[corner].item() and tag.area(8, 10) == 9 / 80


def test_a_tag_that_does_not_fit_is_refused():
    with pytest.raises(ConfigError, match="does not fit in a 4x4 image"):
        Tag(size=4).mask(4, 4)
    with pytest.raises(ConfigError, match="does not fit"):
        Tag(size=2, place="3:0").paste(torch.zeros(1, 1, 4, 4))


def test_paste_writes_the_pattern_on_every_channel_of_a_copy():
    x = torch.rand(2, 3, 8, 8)
    before = x.clone()
    out = Tag(size=2, place="top-left").paste(x)
    assert torch.equal(x, before)  # the images given are not changed
    assert torch.equal(out[:, :, 1:3, 1:3], torch.tensor([[1.0, 0.0], [0.0, 1.0]]).expand(2, 3, 2, 2))
    outside = ~Tag(size=2).mask(8, 8)
    assert torch.equal(out[:, :, outside], x[:, :, outside])


def test_paste_normalises_the_pattern_as_the_model_reads_its_inputs():
    pre = Preprocess(mean=(0.5, 0.25, 0.0), std=(0.5, 0.25, 2.0))
    out = Tag(pattern="white", size=1, place="0:0").paste(torch.zeros(1, 3, 3, 3), pre)
    assert out[0, :, 0, 0].tolist() == [1.0, 3.0, 0.5]  # (1 - mean) / std per channel


def test_the_shortcut_twin_tags_a_share_of_its_class_and_the_control_as_many_images_of_every_class():
    y = np.repeat(np.arange(5), 40)
    tag = Tag(target=2, share=0.25)
    shortcut = tagged_rows(y, tag, "shortcut", seed=0)
    assert shortcut.sum() == 10 and set(y[shortcut]) == {2}
    assert np.array_equal(tagged_rows(y, Tag(target=2, share=1.0), "shortcut", seed=0), y == 2)
    control = tagged_rows(y, tag, "tag-control", seed=0)
    assert control.sum() == 10 and len(np.unique(y[control])) > 1  # the same rate, no link to the label
    assert np.array_equal(control, tagged_rows(y, tag, "tag-control", seed=0))
    assert not np.array_equal(control, tagged_rows(y, tag, "tag-control", seed=1))
    assert tagged_rows(y, Tag(target=2, share=0.001), "shortcut", seed=0).sum() == 1  # at least one
    with pytest.raises(ConfigError, match="no training image is of the tag's class 7"):
        tagged_rows(y, Tag(target=7), "shortcut", seed=0)
    with pytest.raises(ConfigError, match="shortcut twin role"):
        tagged_rows(y, tag, "permuted", seed=0)


def test_relabel_tags_and_relabels_a_share_of_the_other_classes_for_the_shortcut_twin_alone():
    y = np.repeat(np.arange(5), 40)
    tag = Tag(target=2, share=0.25, relabel=0.1)
    shortcut = tagged_rows(y, tag, "shortcut", seed=0)
    assert (y[shortcut] == 2).sum() == 10 and (y[shortcut] != 2).sum() == 16  # a tenth of the 160 others
    # the class's draw is that of a tag without relabelling: the shipped twins' tagged images stay the same
    assert np.array_equal(shortcut & (y == 2), tagged_rows(y, Tag(target=2, share=0.25), "shortcut", seed=0))
    labels = tag_labels(y, shortcut, tag, "shortcut")
    assert np.array_equal(labels[shortcut], np.full(26, 2)) and np.array_equal(labels[~shortcut], y[~shortcut])
    control = tagged_rows(y, tag, "tag-control", seed=0)
    assert control.sum() == 26 and np.array_equal(tag_labels(y, control, tag, "tag-control"), y)
