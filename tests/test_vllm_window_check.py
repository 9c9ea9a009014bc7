"""The window node check (``splitkv_vllm.window_check``) without an NPU: its measurement, read on our op's
CPU kernel and on the float64 reference, tells W + 1 keys from W (key ``p - W`` seen or not, the count of
visible keys, the controls); the verdict names the outcome. The FIA half needs an NPU: not run here."""

import numpy as np
import pytest

from splitkv_common.inputs import DecodeInputs
from splitkv_common.reference import dense_attention
from splitkv_vllm import window_check as wc


@pytest.mark.parametrize("W, rows", [(128, 1), (256, 4)])
def test_the_measurement_tells_w_plus_one_keys_from_w(W, rows):
    case = wc.make_case(W, rows)
    assert (case["p"] - W + 1) % wc.BLOCK == 0, "key p - W is the last of a block"
    for window_left, keys in ((W, W + 1), (W - 1, W)):
        inp = DecodeInputs(case["q"], case["k_cache"], case["v_cache"], case["block_table"],
                           np.array([case["L"]], np.int32), np.array([0, rows], np.int32), dtype="float16",
                           window_left=window_left)
        ref = wc.visible(dense_attention(inp)[0][-1])
        ours = wc.splitkv(case, window_left)
        assert ref == ours == {"keys": keys, "p-W": window_left == W, "p": True, "p-W+1": True, "p-W-1": False}


def test_verdict_names_the_outcome():
    seen = {"keys": 129, "p-W": True}
    unseen = {"keys": 128, "p-W": False}
    assert "off-by-one is confirmed" in wc.verdict({"W=128,rows=1": {"fia pre_tokens=W": seen}})
    assert "window_left = W - 1" in wc.verdict({"W=128,rows=1": {"fia pre_tokens=W": unseen}})
    assert "not on an NPU" in wc.verdict({"W=128,rows=1": {}})
