"""The built-in poolings' declarations (their modules: `modules.py`)."""

from __future__ import annotations

from trainables.poolings.base import Pooling

MEAN = Pooling("trainables.poolings.modules:MeanPooling", "mean", "the mean of the real tokens' states")
CLS = Pooling("trainables.poolings.modules:CLSPooling", "cls", "the first token's state", causal=False)
MAX = Pooling("trainables.poolings.modules:MaxPooling", "max", "the element-wise maximum over the real tokens")
MEAN_SQRT_LEN = Pooling("trainables.poolings.modules:MeanSqrtLenPooling", "mean_sqrt_len_tokens",
                        "the sum of the real tokens' states over the square root of their number")
LAST_TOKEN = Pooling("trainables.poolings.modules:LastTokenPooling", "lasttoken",
                    "the last real token's state, under left or right padding (a decoder's whole-sentence token)")
