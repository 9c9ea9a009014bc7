"""cann-fia without an NPU: the call binds to the op's recorded signature, and the whole mapping
(layouts, lengths, masks, lse and empty-row conventions) reproduces the reference through a torch
emulation of FIA's documented semantics (both in ``fia_emulation.py``)."""

import numpy as np
import pytest
torch = pytest.importorskip("torch")

from ascend_ops import cann_fia  # noqa: E402
from splitkv_common.parity.cases import random_inputs  # noqa: E402
from splitkv_common.reference import dense_attention  # noqa: E402

from . import fia_emulation  # noqa: E402


def _inputs(seq, **kw):
    kw.setdefault("dtype", "float16")
    return random_inputs(0, seq, **kw)


def _call(inp):
    from splitkv_common.torch_io import to_torch

    t = to_torch(inp)
    return cann_fia.fia_call(t["q"], t["k_cache"], t["v_cache"], t["block_table"], inp.seq_lens,
                             inp.query_start_loc, scale=inp.scale, window_left=inp.window_left)


def test_schema_is_parsed():
    p = fia_emulation.parse_schema()
    assert list(p)[:3] == ["query", "key", "value"] and not p["query"]["kwarg_only"]
    assert p["actual_seq_lengths_kv"]["type"] == "SymInt[]?" and p["block_table"]["type"] == "Tensor?"
    assert p["softmax_lse_flag"] == {"type": "bool", "default": "False", "kwarg_only": True}
    assert p["input_layout"]["default"] == '"BSH"' and len(p) == 40


@pytest.mark.parametrize("seq, q_lens, window, layout", [
    ([5, 300, 0], None, None, "BSND"), ([40, 77], [2, 3], None, "TND"), ([200, 90], None, 31, "TND")])
def test_call_binds_to_signature(seq, q_lens, window, layout):
    inp = _inputs(seq, q_lens=q_lens, head_dim=128, window_left=window, page_size=16)
    args, kw, lay = _call(inp)
    assert fia_emulation.check_call(args, kw) == []
    assert kw["input_layout"] == lay["input_layout"] == layout
    assert kw["softmax_lse_flag"] is True and kw["block_size"] == 16
    assert kw["num_heads"] == inp.q.shape[1] and kw["num_key_value_heads"] == inp.k_cache.shape[2]
    assert kw["actual_seq_lengths_kv"] == [int(s) for s in seq]
    if layout == "TND":
        assert kw["actual_seq_lengths"] == np.cumsum(inp.q_lens).tolist()
        assert tuple(kw["atten_mask"].shape) == (2048, 2048)
        assert kw["sparse_mode"] == (4 if window is not None else 3)
        if window is not None:
            assert (kw["pre_tokens"], kw["next_tokens"]) == (window, 0)


def test_check_call_catches_mistakes():
    inp = _inputs([5, 6], head_dim=128, page_size=16)
    args, kw, _ = _call(inp)
    assert any("not a keyword" in p for p in fia_emulation.check_call(args, dict(kw, softmax_scale=1.0)))
    assert any("expected int" in p for p in fia_emulation.check_call(args, dict(kw, block_size=16.0)))
    assert any("expected SymInt[]" in p
               for p in fia_emulation.check_call(args, dict(kw, actual_seq_lengths_kv=torch.ones(2))))


@pytest.mark.parametrize("seq, kw", [
    ([1, 17, 300, 64], dict(head_dim=64, page_size=16)),                       # BSND, GQA
    ([0, 45, 0], dict(head_dim=64, page_size=32)),                            # empty requests
    ([40, 77, 3], dict(q_lens=[2, 4, 3], head_dim=128, page_size=16)),        # TND causal tail
    ([200, 90], dict(head_dim=128, window_left=31, page_size=16)),            # TND band window
    ([33, 129], dict(head_dim=128, dtype="bfloat16", num_q_heads=8, num_kv_heads=1, page_size=64)),
])
def test_fake_fia_end_to_end_matches_reference(seq, kw):
    inp = _inputs(seq, **kw)
    assert cann_fia.fia_unsupported(inp) is None
    out, lse = cann_fia.run_with(fia_emulation.fake_fia, inp)
    ref_out, ref_lse = dense_attention(inp)
    tol = 2e-2 if inp.dtype == "bfloat16" else 3e-3
    assert np.abs(out - ref_out).max() < tol
    both_empty = np.isneginf(ref_lse)
    assert (np.isneginf(lse) == both_empty).all()
    assert np.abs(lse[~both_empty] - ref_lse[~both_empty]).max() < 1e-3
    assert (out[both_empty.any(-1)] == 0).all()


def test_invalid_row_conventions_convert():
    # FIA marks invalid rows with inf (docs) and IFA with -3.4e38: both become out 0, lse -inf
    out = torch.ones(2, 1, 2, 4)
    lse = torch.tensor([[float("inf"), -3.4e38], [1.5, 2.5]]).reshape(2, 2, 1, 1)
    o, l = cann_fia.convert_outputs(out, lse, {"input_layout": "BSND", "T": 2, "B": 2}, [3, 3])
    assert torch.isneginf(l[0]).all() and (o[0] == 0).all()
    assert torch.equal(l[1], torch.tensor([1.5, 2.5])) and (o[1] == 1).all()


@pytest.mark.parametrize("kw, words", [
    (dict(dtype="float32"), "q dtype"), (dict(soft_cap=30.0), "soft cap"), (dict(kv_quant="head"), "int8"),
    (dict(page_size=8), "page size"), (dict(head_dim=72), "multiple of 16"),
    (dict(head_dim=64, q_lens=[2, 1]), "TND"), (dict(head_dim=64, window_left=8), "TND"),
])
def test_unsupported_features(kw, words):
    kw.setdefault("page_size", 16)
    inp = _inputs([30, 40], **kw)
    assert words in cann_fia.fia_unsupported(inp)


def test_backend_is_unavailable_here_with_reason():
    why = cann_fia.cann_fia_backend.unavailable()
    assert why and "torch_npu" in why
