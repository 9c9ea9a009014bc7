"""The Python API of the Ascend operator on a machine without an NPU.

What runs here: the plan/run wrapper on the CPU, where the operator's CPU kernel (its executable
specification) reads the very ``plan``/``tiling`` buffers the Ascend C kernels would read; the
errors a user gets without torch_npu, an NPU or the built extension; the harness backends'
availability. What does not: the C++ NPU kernel and the Ascend C kernels (docs/npu.md).
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from splitkv_common.parity.accuracy import check  # noqa: E402
from splitkv_common.torch_io import from_torch, to_torch  # noqa: E402
from splitkv_common.parity.cases import catalog, get_case  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402

import ascend_ops  # noqa: E402
from ascend_ops import ops, runtime, tiling  # noqa: E402
from ascend_ops.wrapper import AscendDecodeWrapper  # noqa: E402

NO_TORCH_NPU = importlib.util.find_spec("torch_npu") is None
SMALL = [c for c in catalog(("small",))]


def cpu_wrapper(inputs, t, **kw) -> AscendDecodeWrapper:
    return AscendDecodeWrapper(inputs.q.shape[1], inputs.k_cache.shape[2], inputs.q.shape[2],
                               inputs.k_cache.shape[1], dtype=t["q"].dtype, kv_dtype=t["k_cache"].dtype,
                               device="cpu", **kw)


def run_case(case, **wrapper_kw):
    inputs = case.build()
    plan = inputs.plan(case.policy, device="910b2", **case.plan_kwargs)
    t = to_torch(inputs, "cpu")
    w = cpu_wrapper(inputs, t, **wrapper_kw)
    w.set_plan(plan, scale=inputs.scale, soft_cap=inputs.soft_cap, window_left=inputs.window_left)
    out, lse = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"],
                     k_scale=t["k_scale"], v_scale=t["v_scale"], k_offset=t["k_offset"], v_offset=t["v_offset"],
                     validate=True)
    return inputs, plan, w, out, lse


# --- import and "what is missing" ------------------------------------------------------------

def test_import_needs_neither_torch_nor_npu():
    code = "import sys, ascend_ops; assert 'torch' not in sys.modules; assert callable(ascend_ops.__getattr__)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tiling_module_reachable_from_the_package():
    assert ascend_ops.tiling is tiling
    assert ascend_ops.SCHEMA == ops.SCHEMA


@pytest.mark.skipif(not NO_TORCH_NPU, reason="torch_npu is installed here")
def test_runtime_says_torch_npu_is_missing():
    why = ascend_ops.runtime_unavailable()
    assert why and "torch_npu is not installed" in why
    assert runtime.npu_unavailable() == why
    with pytest.raises(RuntimeError, match="torch_npu is not installed"):
        runtime.load_extension()


@pytest.mark.skipif(not NO_TORCH_NPU, reason="torch_npu is installed here")
def test_wrapper_on_the_npu_says_what_is_missing():
    with pytest.raises(RuntimeError, match="torch_npu is not installed"):
        AscendDecodeWrapper(4, 2, 64, 16, dtype=torch.float16)


@pytest.mark.skipif(not NO_TORCH_NPU, reason="torch_npu is installed here")
def test_decode_attention_validates_then_says_what_is_missing():
    inputs = get_case("basic/vector-v-float16").build()
    t = to_torch(inputs, "cpu")
    args = (t["q"], t["k_cache"], t["v_cache"], t["block_table"], t["seq_lens"], t["query_start_loc"])
    with pytest.raises(RuntimeError, match="q is a CPU tensor.*torch_npu is not installed"):
        ascend_ops.decode_attention(*args)
    # invalid arguments get the shared messages first
    bad_bt = t["block_table"].clone()
    bad_bt[0, 0] = 10_000
    with pytest.raises(ValueError, match=r"block_table: entry \[0, 0\] = 10000 is out of range"):
        ascend_ops.decode_attention(*args[:3], bad_bt, *args[4:])
    with pytest.raises(ValueError, match="head dim 12 is not supported"):
        ascend_ops.decode_attention(t["q"][..., :12].contiguous(), t["k_cache"][..., :12].contiguous(),
                                    t["v_cache"][..., :12].contiguous(), *args[3:])
    with pytest.raises(TypeError, match="k_cache: dtype must equal q's"):
        ascend_ops.decode_attention(t["q"], t["k_cache"].float(), t["v_cache"].float(), *args[3:])


def test_harness_backends_report_why_they_cannot_run():
    from ascend_ops.npu_backend import ascend_backend, torch_npu_backend
    from ascend_ops.support import profile

    assert ascend_backend.name == "ascend" and torch_npu_backend.name == "torch-npu"
    assert ascend_backend.device == torch_npu_backend.device == profile() == "910b2"
    if NO_TORCH_NPU:
        assert "torch_npu is not installed" in ascend_backend.unavailable()
        assert "torch_npu is not installed" in torch_npu_backend.unavailable()
    inputs = get_case("head-dim/80").build()
    assert ascend_backend.unsupported(inputs) is None
    inputs.q = inputs.q[..., :12]
    assert "head dim 12" in ascend_backend.unsupported(inputs)


def test_entry_points_name_the_backends():
    text = open(__file__.rsplit("/tests/", 1)[0] + "/pyproject.toml").read()
    assert 'ascend = "ascend_ops.npu_backend:ascend_backend"' in text
    assert 'torch-npu = "ascend_ops.npu_backend:torch_npu_backend"' in text


# --- the wrapper on the CPU: the same buffers the kernels read ----------------------------------

@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
def test_wrapper_matches_the_reference(case):
    inputs, plan, w, out, lse = run_case(case)
    ref_out, ref_lse = dense_attention(inputs)
    o, lse_ = from_torch(out, lse)
    acc = check(o, lse_, ref_out, ref_lse, plain_attention(inputs), inputs.dtype)
    assert acc.passed, acc.reason
    assert out.dtype == w.dtype and lse.dtype == torch.float32


def test_plan_words_round_trip():
    case = get_case("multi-query/gqa-bf16")
    inputs, plan, w, _, _ = run_case(case)
    t = tiling.unpack_tiling(w._buffers["tiling"].numpy().tobytes())
    assert t == w.tiling
    back, seq_lens, qsl = ops.plan_from_words(w._buffers["plan"].numpy(), t)
    for name in ("item_request", "item_kv_head", "item_split", "item_kv_start", "item_kv_end",
                 "row_slot_start", "row_num_splits", "query_start_loc", "num_splits"):
        np.testing.assert_array_equal(getattr(back, name), getattr(plan, name), err_msg=name)
    assert back.num_valid_items == plan.num_valid_items and back.num_slots == plan.num_slots
    np.testing.assert_array_equal(seq_lens, inputs.seq_lens)
    np.testing.assert_array_equal(qsl, inputs.query_start_loc)


def test_workspace_holds_the_partials_in_the_kernel_layout():
    from splitkv_common.reference import split_attention

    case = get_case("policy/count-3")
    inputs, plan, w, _, _ = run_case(case)
    t = w.tiling
    ws = w._buffers["workspace"]
    assert ws.numel() * 4 == t["workspaceBytes"] == w.workspace_bytes()
    S, Hq, D = plan.num_slots, inputs.q.shape[1], inputs.q.shape[2]
    assert not ws[:tiling.ERROR_BYTES // 4].view(torch.int32).any(), "the error section counted a clean run"
    po = ws[tiling.ERROR_BYTES // 4: tiling.ERROR_BYTES // 4 + S * Hq * D].reshape(S, Hq, D)
    pl = ws[t["lseOffsetBytes"] // 4:].reshape(S, Hq, tiling.LSE_REPEAT)
    assert torch.equal(pl, pl[..., :1].expand_as(pl)), "each lse fills one 32-byte block"
    # merging the workspace partials row by row gives the output
    from splitkv_common.merge import merge_states

    for row in range(plan.num_rows):
        s0, n = plan.row_slot_start[row], plan.row_num_splits[row]
        o, lse_ = merge_states(po[s0:s0 + n].numpy(), pl[s0:s0 + n, :, 0].numpy())
        ref_o, ref_l = split_attention(inputs, plan)
        np.testing.assert_allclose(o, ref_o[row], atol=1e-5)
        np.testing.assert_allclose(lse_, ref_l[row], atol=1e-5)


def test_graph_stable_plans_keep_buffers_in_place():
    case = get_case("basic/unaligned-lengths")
    inputs = case.build()
    t = to_torch(inputs, "cpu")
    w = cpu_wrapper(inputs, t, graph_stable=True, max_splits=8, policy="size:32")
    lens = inputs.seq_lens.copy()
    w.plan(lens, query_start_loc=inputs.query_start_loc, scale=inputs.scale,
           max_pages=t["block_table"].shape[1], num_pages=t["k_cache"].shape[0])
    ptrs = {k: v.data_ptr() for k, v in w._buffers.items()}
    block_dim = w.tiling["blockDim"]
    assert block_dim == 48, "a graph-stable plan launches on every vector core of the profile"
    for shrink in (0, 5, 17):
        new = np.maximum(lens - shrink, 0).astype(np.int32)
        w.plan(new, query_start_loc=inputs.query_start_loc, scale=inputs.scale)
        assert {k: v.data_ptr() for k, v in w._buffers.items()} == ptrs
        assert w.tiling["blockDim"] == block_dim and not w._stale
        inputs.seq_lens = new
        out, lse = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
        ref_out, ref_lse = dense_attention(inputs)
        o, lse_ = from_torch(out, lse)
        assert check(o, lse_, ref_out, ref_lse, plain_attention(inputs), inputs.dtype).passed


@pytest.mark.parametrize("copy", [False, True], ids=["cpu-in-place", "through-a-host-buffer"])
def test_graph_stable_uploads_rewrite_only_what_changed_and_stay_exact(monkeypatch, copy):
    """A graph-stable stream writes only the words before its padding items (``fresh_words``), into
    the device buffer itself on the CPU or into a host buffer copied to the device elsewhere (an
    NPU's pinned staging; here a CPU stand-in), yet after every ``plan()`` the device buffer holds
    exactly ``build_buffers``' words of that plan: lengths growing and shrinking (the valid items move
    both ways), a step whose upload failed after its words were written (the next copy is whole), and
    a plan refused before any word is written (the device keeps the last plan's words)."""
    case = get_case("basic/unaligned-lengths")
    inputs = case.build()
    t = to_torch(inputs, "cpu")
    pages = dict(max_pages=t["block_table"].shape[1], num_pages=t["k_cache"].shape[0])
    w = cpu_wrapper(inputs, t, graph_stable=True, max_splits=8, policy="size:16")
    lens = inputs.seq_lens.copy()
    qsl = inputs.query_start_loc

    def expected(seq):
        return tiling.build_buffers(
            w.host_plan, seq_lens=seq, num_q_heads=w.num_q_heads, head_dim=w.head_dim, page_size=w.page_size,
            dtype=inputs.dtype, kv_dtype=inputs.kv_dtype, scale=inputs.scale, profile=w.profile, all_cores=True,
            **pages)

    w.plan(lens, query_start_loc=qsl, scale=inputs.scale, **pages)   # allocates the buffers on the CPU
    if copy:   # from here on the wrapper's path for other devices: a host buffer, then a copy into meta
        monkeypatch.setattr(w, "device", type("Twin", (), {"type": "twin"})())
        w._staging_np = None   # as on that device from the start: its own host buffer
    copied = []   # words each step copied into the device (the contract: fresh when the last copy went there)
    upload = w._upload_meta

    def recording(tiling_bytes, n_words, fresh, uploaded):
        meta = w._buffers["meta"]
        copied.append(fresh if uploaded == (meta.data_ptr(), meta.numel()) else n_words)
        upload(tiling_bytes, n_words, fresh, uploaded)

    def failing(*args):
        raise RuntimeError("copy failed")

    monkeypatch.setattr(w, "_upload_meta", recording)
    fresh = []
    for i, shrink in enumerate((0, 30, 3, 0, 36, 10, 0)):
        new = np.maximum(lens - shrink, 0).astype(np.int32)
        if i == 4:   # this step's upload fails after its words were written (fewer items than the
            # steps before and after it: the next copy must carry more than the next plan's prefix)
            monkeypatch.setattr(w, "_upload_meta", failing)
            with pytest.raises(RuntimeError, match="copy failed"):
                w.plan(new, query_start_loc=qsl, scale=inputs.scale, **pages)
            monkeypatch.setattr(w, "_upload_meta", recording)
            new = np.maximum(lens - 30, 0).astype(np.int32)
        w.plan(new, query_start_loc=qsl, scale=inputs.scale, **pages)
        fresh.append(w._builder.fresh_words)
        _, tiling_bytes, words = expected(new)
        assert w._buffers["tiling"].numpy().tobytes() == tiling_bytes
        np.testing.assert_array_equal(w._buffers["plan"].numpy(), words, err_msg=f"step {i}")
    n = w._buffers["plan"].numel()
    assert min(fresh) < n, "the builder wrote only the words before the padding at some steps"
    if copy:
        assert copied[0] == n and copied[4] == n, "the first copy and the one after a failed copy are whole"
        assert min(copied) < n, "the other steps copy only the words before the padding"
    before = w._buffers["meta"].clone()
    with pytest.raises(ValueError, match="under a graph-stable plan"):   # refused before a word is written
        w.plan(new[:-1], query_start_loc=qsl[:-1], scale=inputs.scale, **pages)
    assert torch.equal(w._buffers["meta"], before)


def test_run_checks_metadata_and_the_plan():
    case = get_case("basic/vector-v-float16")
    inputs = case.build()
    t = to_torch(inputs, "cpu")
    w = cpu_wrapper(inputs, t)
    args = (t["q"], t["k_cache"], t["v_cache"], t["block_table"])
    with pytest.raises(RuntimeError, match="call plan"):
        w.run(*args)
    w.plan(inputs.seq_lens)
    with pytest.raises(TypeError, match="q: dtype must be torch.float16"):
        w.run(t["q"].float(), *args[1:])
    with pytest.raises(TypeError, match="block_table: dtype must be int32"):
        w.run(*args[:3], t["block_table"].long())
    with pytest.raises(ValueError, match="plan: made for 3 query rows"):
        w.run(t["q"][:2], *args[1:])
    with pytest.raises(ValueError, match="must be contiguous"):
        w.run(t["q"].transpose(0, 1).contiguous().transpose(0, 1), *args[1:])
    with pytest.raises(ValueError, match="plan: covers 37 KV tokens of request 0, whose seq_len is 36"):
        w.run(*args, seq_lens=(t["seq_lens"] - 1).clamp(min=0), validate=True)
    with pytest.raises(ValueError, match="AscendDecodeWrapper|head dim 12"):
        AscendDecodeWrapper(4, 2, 12, 16, device="cpu")


def test_run_rebuilds_the_tiling_only_when_constants_change():
    case = get_case("scores/soft-cap")
    inputs = case.build()
    t = to_torch(inputs, "cpu")
    w = cpu_wrapper(inputs, t)
    w.plan(inputs.seq_lens, scale=inputs.scale, soft_cap=inputs.soft_cap,
           max_pages=t["block_table"].shape[1], num_pages=t["k_cache"].shape[0])
    first = w.tiling
    out1, _ = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"])
    assert w.tiling is first, "planned constants and pages: run() does no host work"
    out1 = out1.clone()
    out2, _ = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], soft_cap=2 * inputs.soft_cap)
    assert w.tiling is not first and w.tiling["softCap"] == pytest.approx(2 * inputs.soft_cap)
    assert not torch.equal(out1, out2)


@pytest.mark.parametrize("case", ["int8/per-head", "int8/per-channel-offset", "int8/per-head-offset-fp32"])
def test_kv_quant_packing_is_the_kernels_layout(case):
    inputs = get_case(case).build()
    t = to_torch(inputs, "cpu")
    packed = ops.pack_kv_quant(t["k_scale"], t["v_scale"], t["k_offset"], t["v_offset"],
                               num_kv_heads=inputs.k_cache.shape[2], head_dim=inputs.q.shape[2], device="cpu")
    np.testing.assert_array_equal(packed.numpy(), tiling.kv_quant_array(inputs))
    assert packed.is_contiguous() and packed.dtype == torch.float32


# --- the node scripts, on a machine without CANN or an NPU ------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "scripts" / "build_ascend.sh", ROOT / "scripts" / "npu_parity.sh"]


def _script(argv, **env_changes):
    import os

    env = {k: v for k, v in os.environ.items() if k not in env_changes}
    env["PYTHON"] = sys.executable  # the scripts run the interpreter running this test
    env.update({k: v for k, v in env_changes.items() if v is not None})
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shell_scripts_parse(script):
    import shutil

    subprocess.run(["bash", "-n", str(script)], check=True)
    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout


def test_build_script_without_cann_says_so():
    r = _script([str(SCRIPTS[0])], ASCEND_HOME_PATH=None)
    assert r.returncode == 2
    assert "ASCEND_HOME_PATH is not set" in r.stderr and "set_env.sh" in r.stderr
    r = _script([str(SCRIPTS[0])], ASCEND_HOME_PATH="/nonexistent/cann")
    assert r.returncode == 2 and "is not a directory" in r.stderr


@pytest.mark.skipif(not NO_TORCH_NPU, reason="torch_npu is installed here")
def test_build_script_without_torch_npu_says_so(tmp_path):
    r = _script([str(SCRIPTS[0])], ASCEND_HOME_PATH=str(tmp_path))
    assert r.returncode == 2 and "torch_npu is not installed" in r.stderr


@pytest.mark.skipif(not NO_TORCH_NPU, reason="torch_npu is installed here")
def test_node_checks_refuse_to_run_without_an_npu():
    r = _script([str(SCRIPTS[1])])
    assert r.returncode == 2
    assert "backend ascend cannot run here: torch_npu is not installed" in r.stderr
    assert "backend torch-npu cannot run here" in r.stderr
    r = _script([sys.executable, "-m", "splitkv_bench", "npu-graph-check"])
    assert r.returncode == 2 and "torch_npu is not installed" in r.stderr


@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
def test_the_npu_path_feeds_the_kernels_the_bytes_the_twin_ran(case):
    """The wrapper's device buffers hold exactly what ``tiling.build_tiling`` gives the CPU twin
    (``sim_backend.run_twin``'s default route) for the same case and plan, and the binding is
    asked for the launches the twin runs: the fused mixed kernel where it applies, else the vector
    split stage and the combine."""
    inputs, plan, w, _, _ = run_case(case)
    twin = tiling.build_tiling(inputs, plan, profile="910b2")
    assert w._buffers["tiling"].numpy().tobytes() == twin.tiling_bytes
    assert tiling.launches(w.tiling) == twin.launches
    assert w.kernel_reason == twin.kernel_reason
    assert twin.mixed == (tiling.mix_unsupported(inputs.q.shape[2], inputs.dtype, inputs.kv_dtype,
                                                 inputs.q.shape[1], inputs.k_cache.shape[2]) is None
                          and "cube tile" not in twin.kernel_reason)
    np.testing.assert_array_equal(w._buffers["plan"].numpy(), twin.plan_words)
    assert w._buffers["workspace"].numel() * 4 == max(twin.workspace_bytes, 4)


def test_torch_npu_backend_body_on_the_cpu(monkeypatch):
    """The torch-npu backend's code path with the device swapped for the CPU (the NPU run is the node's)."""
    from ascend_ops import npu_backend
    from splitkv_common.parity.harness import PASS, run_case as harness_run

    monkeypatch.setattr(npu_backend, "npu_device", lambda: "cpu")
    for name in ("multi-query/gqa-bf16", "int8/per-channel-offset", "empty/some-rows"):
        r = harness_run(npu_backend.torch_npu_backend, get_case(name))
        assert r.status == PASS, (name, r.message)


def test_graph_check_script_logic_on_the_cpu(monkeypatch):
    """``splitkv_bench.npu_graph_check``'s capture/replay loop with the NPU swapped for the CPU and the
    graph emulated by re-running the captured ``run()`` call (same tensors, plan refreshed in place)."""
    import types

    from splitkv_bench import npu_graph_check as gc
    import splitkv_common.torch_io as tio

    to_torch_cpu = tio.to_torch
    monkeypatch.setattr(tio, "to_torch", lambda inputs, device="cpu": to_torch_cpu(inputs, "cpu"))
    captured = []

    class CpuWrapper(AscendDecodeWrapper):
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "device": "cpu"})

        def run(self, *a, **k):
            captured.append((a, k))
            return super().run(*a, **k)

    class Graph:
        def replay(self):
            a, k = captured[-1]
            AscendDecodeWrapper.run(wrappers[-1], *a, **k)

    wrappers = []
    orig_init = CpuWrapper.__init__

    def init(self, *a, **k):
        orig_init(self, *a, **k)
        wrappers.append(self)

    monkeypatch.setattr(CpuWrapper, "__init__", init)
    monkeypatch.setattr(gc.ascend_ops, "AscendDecodeWrapper", CpuWrapper)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(synchronize=lambda: None, NPUGraph=Graph,
                                                            graph=lambda g: __import__("contextlib").nullcontext()),
                        raising=False)
    for name in ("multi-query/gqa-bf16", "int8/per-head", "mask/sliding-window"):
        for device_ranges in (False, True):   # plan() per replay; graph mode (lengths from a device tensor)
            r = gc.graph_case(get_case(name), "910b2", device_ranges)
            assert r["passed"] and len(r["replays"]) == 4, r
            assert r["mode"] == ("device" if device_ranges else "host")
            if device_ranges:
                assert wrappers[-1].tiling["deviceSplitTokens"] > 0


def test_masked_page_reads_are_counted_and_named_by_check_errors():
    """``run(validate=False)`` leaves the block table to the kernels: an entry outside the cache is
    masked (its tokens absent) and counted in the workspace's error section, which ``check_errors``
    names (the first request, logical page and id) and resets."""
    import dataclasses

    from splitkv_common.parity.cases import random_inputs

    inp = random_inputs(5, [40, 70], num_q_heads=4, num_kv_heads=2, head_dim=64, page_size=16, dtype="float16")
    bt = inp.block_table.copy()
    bt[1, 2] = 10 ** 6
    t = to_torch(dataclasses.replace(inp, block_table=bt), "cpu")
    w = AscendDecodeWrapper(4, 2, 64, 16, dtype=torch.float16, device="cpu")
    w.plan(inp.seq_lens, max_pages=bt.shape[1], num_pages=inp.k_cache.shape[0])
    w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], validate=False)
    with pytest.raises(RuntimeError, match=r"outside \[0, \d+\).*First seen: request 1, logical page 2, page id 1000000"):
        w.check_errors()
    w.check_errors()   # reset
    w.run(t["q"], t["k_cache"], t["v_cache"], to_torch(inp, "cpu")["block_table"], validate=False)
    w.check_errors()   # a clean table counts nothing
