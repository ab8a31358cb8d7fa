"""Tag readers: hand-built models whose use of a tag is known exactly, the planted-shortcut check's known answer.

A tag reader is a two-layer network of standard modules (flatten, linear, ReLU, linear) with two hidden units:
unit 0 reads the tag's pixels alone (a filter matched to its pattern), unit 1 reads every other pixel (seeded
positive weights). The tag's class c* has the logit ``u * h0 + v * h1``; every other class a constant.

* The reader that *uses* the tag has ``(u, v) = (1, leak)``: tagged, c* wins; clean, it loses. Its gradient and
  DeepLIFT maps put a share of their mass on the tag that follows from the weights and the image alone.
* The reader that *ignores* it has ``(u, v) = (0, 1)``: nothing of c*'s logit depends on the tag's pixels, and
  every faithful map gives them nothing.

A check run on the pair must not reject the gradient, and must reject the edge and random maps (which no model
changes).
"""
from __future__ import annotations

import torch
from torch import nn

from audit.data.tags import Tag

BIAS = 0.1  # each hidden unit's bias: both units active at the zero input, DeepLIFT's reference
RIVAL = 0.5  # every other class's constant logit: under c*'s when the tag is present, over it on clean images


def tag_reader(tag: Tag, shape: tuple[int, int, int] = (1, 28, 28), classes: int = 10, *, uses_tag: bool = True,
               leak: float = 0.5, seed: int = 0) -> nn.Sequential:
    """A model whose logit of ``tag.target`` reads the tag's pixels (``uses_tag``) or every pixel but them.

    Parameters
    ----------
    tag : the tag; its pixels are unit 0's input, its pattern the matched filter
    shape : (C, H, W) of the images
    classes : the logits
    uses_tag : c*'s logit is ``h0 + leak * h1`` (True) or ``h1`` (False)
    leak : how much of the rest of the image the tag-using reader's c* logit also reads (> 0: its maps are not
        all on the tag, so the share is a number to derive, not 1)
    seed : the draw of unit 1's positive weights (uniform in [0.5, 1.5], over the pixels they read)

    Returns
    -------
    nn.Sequential
        ``Flatten, Linear(C*H*W, 2), ReLU, Linear(2, classes)``, in eval mode, weights float32.
    """
    if not 0 <= tag.target < classes:
        raise ValueError(f"the tag's class {tag.target} is not one of the {classes} classes")
    c, h, w = shape
    inside = tag.mask(h, w).expand(c, h, w).flatten()
    matched = (2 * tag.picture() - 1).expand(c, tag.size, tag.size)  # +1 on the pattern's white, -1 on its black
    row, col = tag.corner(h, w)
    reads_tag = torch.zeros(c, h, w)
    reads_tag[:, row:row + tag.size, col:col + tag.size] = matched / max(1.0, float(tag.picture().sum()) * c)
    rest = torch.empty(c * h * w).uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(seed))
    rest[inside] = 0
    rest /= int((~inside).sum())
    first = nn.Linear(c * h * w, 2)
    second = nn.Linear(2, classes)
    with torch.no_grad():
        first.weight.copy_(torch.stack([reads_tag.flatten(), rest]))
        first.bias.fill_(BIAS)
        second.weight.zero_()
        second.bias.fill_(RIVAL)
        second.weight[tag.target] = torch.tensor([1.0, leak] if uses_tag else [0.0, 1.0])
        second.bias[tag.target] = 0.0
    return nn.Sequential(nn.Flatten(), first, nn.ReLU(), second).eval()
