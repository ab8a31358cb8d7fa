"""Tag readers: the known answer's models use the tag, or ignore it, exactly as built."""
import torch
from torch import nn

from audit.data.datasets import embedded_sample
from audit.data.tags import Tag
from audit.models.tag_readers import tag_reader

TAG = Tag(target=3, pattern="checker", size=4, place="bottom-right")


def test_the_tag_using_reader_predicts_the_class_when_tagged_and_the_ignoring_reader_does_not_read_the_tag():
    x, y = embedded_sample()
    x = torch.from_numpy(x[y != 3][::20])
    uses, ignores = tag_reader(TAG), tag_reader(TAG, uses_tag=False)
    assert [type(m) for m in uses] == [nn.Flatten, nn.Linear, nn.ReLU, nn.Linear]  # standard modules only
    with torch.no_grad():
        assert (uses(TAG.paste(x)).argmax(1) == 3).all() and (uses(x).argmax(1) != 3).all()
        noise = x.clone()
        noise[:, :, TAG.mask(28, 28)] = torch.rand_like(noise[:, :, TAG.mask(28, 28)])
        assert torch.equal(ignores(noise)[:, 3], ignores(x)[:, 3])  # nothing of c*'s logit reads the tag
        assert not torch.equal(uses(noise)[:, 3], uses(x)[:, 3])
        others = [c for c in range(10) if c != 3]
        assert torch.equal(uses(noise)[:, others], uses(x)[:, others])


def test_the_ignoring_reader_differs_from_the_using_one_in_the_logit_weights_alone():
    uses, ignores = tag_reader(TAG, seed=4), tag_reader(TAG, uses_tag=False, seed=4)
    a, b = uses.state_dict(), ignores.state_dict()
    assert [k for k in a if not torch.equal(a[k], b[k])] == ["3.weight"]
