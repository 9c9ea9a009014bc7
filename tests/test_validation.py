"""Input validation: every error of ``check_decode_args`` names its argument; valid calls give the sizes."""

import math

import numpy as np
import pytest

from splitkv_common.parity.cases import random_inputs
from splitkv_common.validation import DecodeDims, check_decode_args, host, normalize_window

T, HQ, HKV, D, P, PAGE = 2, 4, 2, 8, 5, 4


def base():
    """A valid call: 2 requests of 5 and 8 tokens in pages of 4."""
    return dict(
        q=np.zeros((T, HQ, D), np.float32),
        k_cache=np.zeros((P, PAGE, HKV, D), np.float32),
        v_cache=np.zeros((P, PAGE, HKV, D), np.float32),
        block_table=np.array([[3, 0], [1, 4]], np.int32),
        seq_lens=np.array([5, 8], np.int32),
    )


def int8_base(shape=(HKV,)):
    a = base()
    a["k_cache"] = np.zeros((P, PAGE, HKV, D), np.int8)
    a["v_cache"] = np.zeros((P, PAGE, HKV, D), np.int8)
    a["k_scale"] = np.ones(shape, np.float32)
    a["v_scale"] = np.ones(shape, np.float32)
    return a


def call(args):
    args = dict(args)
    pos = [args.pop(k) for k in ("q", "k_cache", "v_cache", "block_table", "seq_lens")]
    return check_decode_args(*pos, **args)


def with_(args=None, **changes):
    a = base() if args is None else args
    a.update(changes)
    return a


def _seq(*v):
    return np.array(v, np.int32)


CASES = [
    # (id, args, exception, match)
    ("q-not-array", with_(q=[[[0.0]]]), TypeError, r"^q: expected an array"),
    ("k-not-array", with_(k_cache=3.0), TypeError, r"^k_cache: expected an array"),
    ("v-not-array", with_(v_cache=None), TypeError, r"^v_cache: expected an array"),
    ("q-rank", with_(q=np.zeros((T, HQ * D), np.float32)), ValueError, r"^q: must be \[T, Hq, D\]"),
    ("k-rank", with_(k_cache=np.zeros((P * PAGE, HKV, D), np.float32)), ValueError,
     r"^k_cache: must be \[num_pages, page_size, Hkv, D\]"),
    ("v-shape", with_(v_cache=np.zeros((P, PAGE, HKV, D + 1), np.float32)), ValueError, r"^v_cache: shape"),
    ("zero-head-dim", with_(q=np.zeros((T, HQ, 0), np.float32), k_cache=np.zeros((P, PAGE, HKV, 0), np.float32),
                            v_cache=np.zeros((P, PAGE, HKV, 0), np.float32)), ValueError, r"^q, k_cache: .*positive"),
    ("zero-page-size", with_(k_cache=np.zeros((P, 0, HKV, D), np.float32), v_cache=np.zeros((P, 0, HKV, D), np.float32)),
     ValueError, r"^q, k_cache: .*page size"),
    ("zero-q-heads", with_(q=np.zeros((T, 0, D), np.float32)), ValueError, r"^q, k_cache"),
    ("head-dim-mismatch", with_(k_cache=np.zeros((P, PAGE, HKV, 16), np.float32),
                                v_cache=np.zeros((P, PAGE, HKV, 16), np.float32)), ValueError, r"^k_cache: head dim 16"),
    ("gqa-ratio", with_(q=np.zeros((T, 3, D), np.float32)), ValueError, r"^q: Hq % Hkv must be 0.*Hq=3, Hkv=2"),
    ("unsupported-head-dim", with_(supported_head_dims=(64, 128), backend="triton"), ValueError,
     r"^q: head dim 8 is not supported \(triton\); supported: \[64, 128\]"),
    ("q-float64", with_(q=np.zeros((T, HQ, D))), TypeError, r"^q: dtype must be one of .*float64"),
    ("q-int8", with_(q=np.zeros((T, HQ, D), np.int8)), TypeError, r"^q: dtype"),
    ("kv-dtype-differ", with_(v_cache=np.zeros((P, PAGE, HKV, D), np.float16)), TypeError,
     r"^v_cache: dtype float16 must equal k_cache's float32"),
    ("k-dtype-not-q", with_(k_cache=np.zeros((P, PAGE, HKV, D), np.float16),
                            v_cache=np.zeros((P, PAGE, HKV, D), np.float16)), TypeError,
     r"^k_cache: dtype must equal q's \(float32\) or be int8"),
    ("int8-no-k-scale", with_(int8_base(), k_scale=None), ValueError, r"^k_scale: required when the KV cache is int8"),
    ("int8-no-v-scale", with_(int8_base(), v_scale=None), ValueError, r"^v_scale: required when the KV cache is int8"),
    ("float-kv-k-scale", with_(k_scale=np.ones(HKV, np.float32)), ValueError, r"^k_scale: only valid with an int8"),
    ("float-kv-v-scale", with_(v_scale=np.ones(HKV, np.float32)), ValueError, r"^v_scale: only valid"),
    ("float-kv-k-offset", with_(k_offset=np.ones(HKV, np.float32)), ValueError, r"^k_offset: only valid"),
    ("float-kv-v-offset", with_(v_offset=np.ones(HKV, np.float32)), ValueError, r"^v_offset: only valid"),
    ("k-scale-shape", with_(int8_base(), k_scale=np.ones(3, np.float32)), ValueError,
     r"^k_scale: must be \[Hkv\] \(per head\) or \[Hkv, D\] \(per channel\)"),
    ("v-scale-shape", with_(int8_base(), v_scale=np.ones((HKV, D + 1), np.float32)), ValueError, r"^v_scale: must be"),
    ("k-scale-not-array", with_(int8_base(), k_scale=0.5), TypeError, r"^k_scale: expected an array"),
    ("k-scale-dtype", with_(int8_base(), k_scale=np.ones(HKV)), TypeError, r"^k_scale: dtype must be float32"),
    ("v-scale-dtype", with_(int8_base(), v_scale=np.ones(HKV, np.float16)), TypeError, r"^v_scale: dtype"),
    ("k-offset-shape", with_(int8_base(), k_offset=np.ones(5, np.float32)), ValueError, r"^k_offset: must be"),
    ("k-offset-vs-scale", with_(int8_base(), k_offset=np.ones((HKV, D), np.float32)), ValueError,
     r"^k_offset: shape \(2, 8\) must equal its scale's \(2,\)"),
    ("v-offset-vs-scale", with_(int8_base((HKV, D)), v_offset=np.ones(HKV, np.float32)), ValueError,
     r"^v_offset: shape \(2,\) must equal its scale's"),
    ("v-offset-dtype", with_(int8_base(), v_offset=np.ones(HKV, np.float64)), TypeError, r"^v_offset: dtype"),
    ("bt-not-array", with_(block_table=[[0, 1], [2, 3]]), TypeError, r"^block_table: expected an array"),
    ("bt-rank", with_(block_table=np.array([3, 0, 1, 4], np.int32)), ValueError, r"^block_table: must be \[B, max_pages\]"),
    ("bt-dtype", with_(block_table=np.array([[3, 0], [1, 4]], np.float32)), TypeError,
     r"^block_table: dtype must be int32 or int64"),
    ("bt-int16", with_(block_table=np.array([[3, 0], [1, 4]], np.int16)), TypeError, r"^block_table: dtype"),
    ("seq-not-array", with_(seq_lens=[5, 8]), TypeError, r"^seq_lens: expected an array"),
    ("seq-shape", with_(seq_lens=_seq(5, 8, 1)), ValueError, r"^seq_lens: must be \[B\] = \[2\]"),
    ("seq-dtype", with_(seq_lens=np.array([5.0, 8.0])), TypeError, r"^seq_lens: dtype must be int32 or int64"),
    ("seq-negative", with_(seq_lens=_seq(5, -1)), ValueError, r"^seq_lens: negative lengths.*\[-1\]"),
    ("seq-too-long", with_(seq_lens=_seq(5, 9)), ValueError,
     r"^seq_lens: request 1 has 9 tokens, beyond the 2 pages x 4 tokens"),
    ("qsl-required", with_(q=np.zeros((3, HQ, D), np.float32)), ValueError,
     r"^query_start_loc: required when q has 3 rows for 2 requests"),
    ("qsl-shape", with_(query_start_loc=_seq(0, 2)), ValueError, r"^query_start_loc: must be \[B \+ 1\] = \[3\]"),
    ("qsl-not-array", with_(query_start_loc=[0, 1, 2]), TypeError, r"^query_start_loc: expected an array"),
    ("qsl-dtype", with_(query_start_loc=np.array([0.0, 1.0, 2.0])), TypeError, r"^query_start_loc: dtype"),
    ("qsl-start", with_(query_start_loc=_seq(1, 1, 2)), ValueError, r"^query_start_loc: must start at 0"),
    ("qsl-decreasing", with_(q=np.zeros((1, HQ, D), np.float32), query_start_loc=_seq(0, 2, 1)), ValueError,
     r"^query_start_loc: must start at 0, be non-decreasing"),
    ("qsl-end", with_(query_start_loc=_seq(0, 1, 3)), ValueError, r"^query_start_loc: .*end at T=2"),
    ("bt-entry-high", with_(block_table=np.array([[3, 0], [1, 5]], np.int32)), ValueError,
     r"^block_table: entry \[1, 1\] = 5 is out of range \[0, 5\)"),
    ("bt-entry-negative", with_(block_table=np.array([[-1, 0], [1, 4]], np.int32)), ValueError,
     r"^block_table: entry \[0, 0\] = -1"),
    ("scale-zero", with_(scale=0.0), ValueError, r"^scale: must be a finite positive number"),
    ("scale-negative", with_(scale=-0.1), ValueError, r"^scale:"),
    ("scale-inf", with_(scale=math.inf), ValueError, r"^scale:"),
    ("scale-nan", with_(scale=math.nan), ValueError, r"^scale:"),
    ("scale-str", with_(scale="0.1"), ValueError, r"^scale:"),
    ("soft-cap-zero", with_(soft_cap=0.0), ValueError, r"^soft_cap: must be None or a finite positive number"),
    ("soft-cap-negative", with_(soft_cap=-30.0), ValueError, r"^soft_cap:"),
    ("soft-cap-inf", with_(soft_cap=math.inf), ValueError, r"^soft_cap:"),
    ("window-below-minus-one", with_(window_left=-2), ValueError, r"^window_left: must be None, -1"),
    ("window-float", with_(window_left=3.0), ValueError, r"^window_left:"),
    ("window-str", with_(window_left="8"), ValueError, r"^window_left:"),
]


@pytest.mark.parametrize("args, exc, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_each_error_names_its_argument(args, exc, match):
    with pytest.raises(exc, match=match):
        call(args)


def test_the_base_call_is_valid():
    dims = call(base())
    assert dims == DecodeDims(num_rows=T, num_q_heads=HQ, num_kv_heads=HKV, head_dim=D, num_pages=P, page_size=PAGE,
                              batch_size=2, max_pages=2, dtype="float32", kv_dtype="float32")
    assert dims.group_size == 2


def test_valid_variants():
    # unused block-table entries may hold anything (-1 padding); seq_len 0 is legal
    call(with_(block_table=np.array([[3, -1], [1, 4]], np.int32), seq_lens=_seq(4, 8)))
    call(with_(block_table=np.array([[-1, 99], [1, 4]], np.int64), seq_lens=np.array([0, 8], np.int64)))
    # multi-query rows, int64 tables, empty requests in query_start_loc
    call(with_(q=np.zeros((5, HQ, D), np.float32), query_start_loc=np.array([0, 5, 5], np.int64)))
    # MQA and every supported way to give int8 scales
    call(with_(q=np.zeros((T, 6, D), np.float32)))
    for shape in ((HKV,), (HKV, D)):
        a = int8_base(shape)
        a.update(k_offset=np.ones(shape, np.float32), v_offset=np.zeros(shape, np.float32))
        assert call(a).kv_dtype == "int8"
    # numbers of every kind
    for scale in (1, 0.125, np.float32(0.125), np.float64(2.0)):
        call(with_(scale=scale, soft_cap=np.float32(30.0)))
    for w in (None, -1, 0, 7, np.int32(3)):
        call(with_(window_left=w))
    call(with_(supported_head_dims=(8, 64)))
    # an empty batch
    call(dict(q=np.zeros((0, HQ, D), np.float32), k_cache=np.zeros((1, PAGE, HKV, D), np.float32),
              v_cache=np.zeros((1, PAGE, HKV, D), np.float32), block_table=np.zeros((0, 0), np.int32),
              seq_lens=np.zeros(0, np.int32)))


def test_torch_tensors_are_validated_by_dtype_name():
    torch = pytest.importorskip("torch")
    a = base()
    t = {k: torch.from_numpy(v) for k, v in a.items()}
    t["q"] = t["q"].to(torch.bfloat16)
    t["k_cache"] = t["k_cache"].to(torch.bfloat16)
    t["v_cache"] = t["v_cache"].to(torch.bfloat16)
    dims = call(t)
    assert dims.dtype == "bfloat16" and dims.kv_dtype == "bfloat16"
    t["v_cache"] = t["v_cache"].to(torch.float16)
    with pytest.raises(TypeError, match=r"^v_cache: dtype float16 must equal k_cache's bfloat16"):
        call(t)
    t["v_cache"] = t["v_cache"].to(torch.bfloat16)
    t["seq_lens"] = torch.tensor([5, 9], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^seq_lens: request 1 has 9 tokens"):
        call(t)
    np.testing.assert_array_equal(host(torch.arange(3)), [0, 1, 2])


def test_decode_inputs_validate_uses_the_logical_dtype():
    inp = random_inputs(0, [5, 0], dtype="bfloat16")
    dims = inp.validate(supported_head_dims=(64,), backend="x")
    assert dims.dtype == "bfloat16" and dims.kv_dtype == "bfloat16" and dims.batch_size == 2
    with pytest.raises(ValueError, match=r"^q: head dim 64 is not supported \(x\)"):
        inp.validate(supported_head_dims=(128,), backend="x")
    q8 = random_inputs(0, [5], kv_quant="channel", kv_offset=True, dtype="float16")
    assert q8.validate().kv_dtype == "int8"


def test_normalize_window():
    assert normalize_window(None) is None
    assert normalize_window(-1) is None
    assert normalize_window(0) == 0
    assert normalize_window(np.int64(12)) == 12


def test_wrapper_tensor_checks_name_the_argument():
    from types import SimpleNamespace as T

    from splitkv_common.validation import check_wrapper_tensors

    def named(**kw):
        base = dict(q=T(device="dev", dtype="bf16"), k_cache=T(device="dev", dtype="bf16"),
                    v_cache=T(device="dev", dtype="bf16"), k_scale=None, v_scale=None)
        return {**base, **kw}

    kw = dict(tensor_type=T, dtype="bf16", kv_dtype="bf16", int8_kv=False, device="dev",
              on_device=lambda d: d == "dev")
    check_wrapper_tensors(named(), **kw)
    for bad, err, words in ((dict(q=np.zeros(3)), TypeError, "q: expected a torch tensor"),
                            (dict(v_cache=T(device="other", dtype="bf16")), ValueError, "v_cache: on other"),
                            (dict(q=T(device="dev", dtype="fp16")), TypeError, "q: dtype must be bf16"),
                            (dict(k_cache=T(device="dev", dtype="i8")), TypeError, "k_cache, v_cache: dtype"),
                            (dict(k_scale=T(device="dev", dtype="f32"), v_scale=T(device="dev", dtype="f32")),
                             ValueError, "k_scale, v_scale: required with an int8")):
        with pytest.raises(err, match=words):
            check_wrapper_tensors(named(**bad), **kw)
