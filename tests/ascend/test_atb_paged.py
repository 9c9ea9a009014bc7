"""atb-paged without an NPU: the call binds to ``_npu_paged_attention``'s recorded schema, and the
mapping reproduces the float64 reference through a fake op that checks every argument against the
op's documented contract (ATB PagedAttentionOperation) and computes what it documents."""

from __future__ import annotations

import numpy as np
import pytest
torch = pytest.importorskip("torch")

from ascend_ops import atb_paged  # noqa: E402
from splitkv_common.parity import cases  # noqa: E402
from splitkv_common.parity.accuracy import check  # noqa: E402
from splitkv_common.parity.harness import UNSUPPORTED, run_case  # noqa: E402
from splitkv_common.parity.registry import Backend  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402


def _schema_args(schema: str = atb_paged.ATB_SCHEMA) -> list[tuple[str, str]]:
    """``[(type, name)]`` of the schema's arguments, in order."""
    inner = schema[schema.index("(") + 1:schema.rindex(") ->")]
    return [tuple(a.strip().rsplit(" ", 1)) for a in inner.split(",")]


SCHEMA = _schema_args()
TYPES = {"Tensor": torch.Tensor, "Tensor(a!)": torch.Tensor, "int": int, "float": float}


def fake_paged_attention(*args, **kwargs):
    """``_npu_paged_attention`` as documented, on CPU tensors: binds the call to the schema, checks the
    documented constraints (shapes, dtypes, int32 tables, page ids in range, block_size % 16,
    head_size * block_size <= 16384), then writes ``out`` in float64 and rounds to its dtype."""
    names = [n for _, n in SCHEMA]
    if len(args) > len(names):
        raise TypeError("too many positional arguments")
    bound = dict(zip(names, args))
    for k, v in kwargs.items():
        if k not in names or k in bound:
            raise TypeError(f"unexpected or repeated argument {k!r}")
        bound[k] = v
    for typ, name in SCHEMA:
        if name not in bound:
            raise TypeError(f"missing argument {name!r}")
        if not isinstance(bound[name], TYPES[typ]) or isinstance(bound[name], bool):
            raise TypeError(f"{name}: expected {typ}, got {type(bound[name]).__name__}")
    q, kc, vc = bound["query"], bound["key_cache"], bound["value_cache"]
    bt, cl, out = bound["block_table"], bound["context_lens"], bound["out"]
    hq, hkv = bound["num_heads"], bound["num_kv_heads"]
    T, hq_q, d = q.shape
    P, page, hkv_c, d_c = kc.shape
    assert (hq_q, hkv_c, d_c) == (hq, hkv, d) and vc.shape == kc.shape and hq % hkv == 0
    assert q.dtype in (torch.float16, torch.bfloat16) and kc.dtype == vc.dtype == q.dtype
    assert bt.dtype == torch.int32 and bt.shape[0] == T and cl.dtype == torch.int32 and cl.shape == (T,)
    assert cl.device.type == "cpu", "context_lens is a host tensor"
    assert page % 16 == 0 and 0 < d <= 256 and d * page <= 128 * 128
    assert out.shape == q.shape and out.dtype == q.dtype
    g = hq // hkv
    for t in range(T):
        L = int(cl[t])
        pages = bt[t, : -(-L // page)].long()
        assert ((pages >= 0) & (pages < P)).all(), "blockTables entries in [0, num_blocks)"
        pos = torch.arange(L)
        k = kc[pages[pos // page], pos % page].double()  # [L, Hkv, D]
        v = vc[pages[pos // page], pos % page].double()
        for h in range(hq):
            s = (k[:, h // g] @ q[t, h].double()) * bound["scale_value"]
            w = torch.softmax(s, 0)
            out[t, h] = (w[:, None] * v[:, h // g]).sum(0).to(out.dtype)


def _backend():
    return Backend("atb-paged-fake", lambda inp, plan: atb_paged.run_with(fake_paged_attention, inp),
                   unsupported=atb_paged.atb_unsupported, extra={"lse": False})


def test_schema_is_the_recorded_one():
    assert [n for _, n in SCHEMA] == ["query", "key_cache", "value_cache", "num_kv_heads", "num_heads", "scale_value",
                                      "block_table", "context_lens", "out"]
    assert dict((n, t) for t, n in SCHEMA)["out"] == "Tensor(a!)"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_call_binds_and_reproduces_the_reference(dtype):
    inp = cases.random_inputs(3, [300, 17, 129], num_q_heads=8, num_kv_heads=2, head_dim=128, page_size=128,
                              dtype=dtype)
    out, lse = atb_paged.run_with(fake_paged_attention, inp)
    assert lse is None
    ro, rl = dense_attention(inp)
    acc = check(out, None, ro, rl, plain_attention(inp), dtype)
    assert acc.passed, acc.reason
    assert "out only" in acc.reason


def test_call_arguments():
    inp = cases.random_inputs(4, [40, 77], num_q_heads=12, num_kv_heads=4, head_dim=64, page_size=32)
    t = {k: torch.as_tensor(np.asarray(getattr(inp, k))) for k in ("block_table",)}
    q = torch.zeros(inp.q.shape, dtype=torch.float16)
    kc = torch.zeros(inp.k_cache.shape, dtype=torch.float16)
    args, kw = atb_paged.atb_call(q, kc, kc, t["block_table"].long(), inp.seq_lens, scale=0.25)
    assert args == () and kw["num_heads"] == 12 and kw["num_kv_heads"] == 4 and kw["scale_value"] == 0.25
    assert kw["block_table"].dtype == torch.int32 and kw["context_lens"].tolist() == [40, 77]
    assert kw["out"].shape == q.shape and kw["out"].dtype == q.dtype


def test_fake_op_catches_mistakes():
    inp = cases.random_inputs(5, [20], num_q_heads=4, num_kv_heads=2, head_dim=64, page_size=16, dtype="float16")
    q = torch.zeros(inp.q.shape, dtype=torch.float16)
    kc = torch.zeros(inp.k_cache.shape, dtype=torch.float16)
    bt = torch.as_tensor(inp.block_table)
    _, kw = atb_paged.atb_call(q, kc, kc, bt, inp.seq_lens, scale=0.125)
    with pytest.raises(TypeError, match="scale_value"):
        fake_paged_attention(**dict(kw, scale_value=1))
    with pytest.raises(TypeError, match="unexpected"):
        fake_paged_attention(**dict(kw, softmax_scale=1.0))
    with pytest.raises(AssertionError):
        fake_paged_attention(**dict(kw, num_kv_heads=4))
    with pytest.raises(AssertionError):
        fake_paged_attention(**dict(kw, context_lens=kw["context_lens"].long()))


@pytest.mark.parametrize("kw, why", [
    (dict(soft_cap=30.0), "soft cap"), (dict(window_left=8), "window"), (dict(q_lens=[2, 1]), "multi-query"),
    (dict(kv_quant="head"), "KV dtype"), (dict(dtype="float32"), "q dtype"), (dict(page_size=8), "block_size"),
    (dict(page_size=128, head_dim=256), "16384"), (dict(seq=[0, 5]), "no KV token")])
def test_what_it_cannot_do_is_declared(kw, why):
    seq = kw.pop("seq", [30, 5])
    kw.setdefault("dtype", "float16")
    kw.setdefault("page_size", 16)
    inp = cases.random_inputs(6, seq, num_q_heads=4, num_kv_heads=2, **kw)
    assert why in atb_paged.atb_unsupported(inp)
    with pytest.raises(ValueError, match="atb-paged"):
        atb_paged.run_with(fake_paged_attention, inp)


def test_harness_runs_the_catalog_through_the_fake_and_skips_with_reasons():
    """Every small catalog case either passes on out (no lse from this op) or is unsupported with a reason."""
    backend = _backend()
    seen = {UNSUPPORTED: 0, "pass": 0}
    for case in cases.catalog(("small",)):
        inp = case.build()
        if int(np.asarray(inp.seq_lens).max(initial=0)) > 2048:
            continue  # the fake op is a per-head loop in float64: keep the test short
        r = run_case(backend, case)
        assert r.status in seen, (case.name, r.status, r.message)
        if r.status == UNSUPPORTED:
            assert r.message
        seen[r.status] += 1
    assert seen["pass"] >= 3 and seen[UNSUPPORTED] >= 3


def test_unavailable_here_with_a_reason():
    assert atb_paged.atb_paged_unavailable()
