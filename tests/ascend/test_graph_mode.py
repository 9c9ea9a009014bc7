"""Graph mode on the CPU twin: a split size fixed at capture, work derived from ``seq_lens`` on the device.

With ``deviceSplitTokens = S`` the kernels read no work items: they take the grid over (split j,
request, KV head), the range ``[j S, min((j + 1) S, seq_len))`` and the partial slot
``row * max_splits + j`` from the ``seqLens`` section of the plan buffer, which the wrapper
overwrites on the device before each launch. A "replay" here is the same tiling bytes and plan
words with only that section changed. A test double: nothing here ran on an NPU.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from splitkv_common.parity import cases
from splitkv_common.reference import dense_attention

sim = pytest.importorskip("ascend_ops.sim_backend")
from ascend_ops import tiling as tl  # noqa: E402

pytestmark = pytest.mark.skipif(sim.compiler_missing() is not None, reason=str(sim.compiler_missing()))

S, CAP = 256, 8          # split size fixed at capture; slots per query row


def _capture(dtype, window):
    """Inputs whose cache holds 2048 tokens per request, and the graph-mode tiling of their first step."""
    full = cases.random_inputs(11, [2048, 2048, 2048, 2048], num_q_heads=8, num_kv_heads=2, head_dim=64,
                               page_size=64, dtype=dtype, q_lens=[1, 2, 1, 1], window_left=window)
    first = dataclasses.replace(full, seq_lens=np.array([700, 33, 0, 1200], np.int32))
    plan = first.plan(f"size:{S}", device="910b2", graph_stable=True, max_splits=CAP)
    return full, plan


@pytest.mark.parametrize("window", [None, 300])
@pytest.mark.parametrize("kernel,dtype", [("mix", "bfloat16"), ("vector", "bfloat16"), ("vector", "float32")])
def test_replays_with_new_lengths_and_the_same_tiling(kernel, dtype, window):
    full, plan = _capture(dtype, window)
    first = dataclasses.replace(full, seq_lens=np.array([700, 33, 0, 1200], np.int32))
    til = tl.build_tiling(first, plan, kernel=kernel, device_split_tokens=S)
    assert til.mixed == (kernel == "mix") and til.fields["deviceSplitTokens"] == S
    assert til.fields["numItems"] == 4 * 2 * CAP
    for lens in ([700, 33, 0, 1200], [1500, 2, 64, 2048], [1, 2, 1, 1], [0, 300, 2048, 257]):
        inp = dataclasses.replace(full, seq_lens=np.array(lens, np.int32))
        out, lse = sim.run_tiling(inp, plan, sim.with_seq_lens(til, lens))
        ro, rl = dense_attention(inp)
        atol = 2e-2 if dtype == "bfloat16" else 2e-5
        np.testing.assert_allclose(out, ro, atol=atol, rtol=0, err_msg=str(lens))
        ok = np.isfinite(rl)
        assert (np.isneginf(lse) == ~ok).all(), lens
        np.testing.assert_allclose(lse[ok], rl[ok], atol=1e-3 if dtype == "bfloat16" else 1e-5, rtol=0)


@pytest.mark.parametrize("kernel", ["mix", "vector"])
def test_device_lengths_the_host_never_saw_are_read_within_the_row_and_counted(kernel):
    """Graph mode's lengths live on the device: one past the block-table row (1536 tokens here) is
    read up to the row, never into the next request's entries; a negative one reads nothing; one
    past the plan's S * max_splits too. Each is counted in the workspace's error section (request
    bits 1, 2, 16), and a second launch on the same workspace adds to the counts."""
    full, plan = _capture("bfloat16", None)
    narrow = dataclasses.replace(full, block_table=full.block_table[:, :24].copy(),
                                 seq_lens=np.array([700, 33, 0, 1200], np.int32))
    til = tl.build_tiling(narrow, plan, kernel=kernel, device_split_tokens=S)
    assert til.mixed == (kernel == "mix")
    lens = [1800, -5, 2100, 100]
    ws = sim.new_workspace(til)
    out, lse = sim.run_tiling(narrow, plan, sim.with_seq_lens(til, lens), ws=ws)
    ro, rl = dense_attention(dataclasses.replace(narrow, seq_lens=np.array([1536, 0, 1536, 100], np.int32)))
    np.testing.assert_allclose(out, ro, atol=2e-2, rtol=0)
    ok = np.isfinite(rl)
    assert (np.isneginf(lse) == ~ok).all()
    np.testing.assert_allclose(lse[ok], rl[ok], atol=1e-3, rtol=0)
    rec = sim.read_errors(ws)
    assert rec[4:8] == [1 | 2 | 16, 3, 0, 1] and rec[0] == 0
    sim.run_tiling(narrow, plan, sim.with_seq_lens(til, lens), ws=ws)
    assert sim.read_errors(ws)[5] == 6
    clean = sim.new_workspace(til)
    sim.run_tiling(narrow, plan, sim.with_seq_lens(til, [1536, 0, 5, 100]), ws=clean)
    assert not any(sim.read_errors(clean))


def test_a_replay_equals_a_fresh_host_plan_bit_for_bit():
    """The same split size: the grid's ranges are the host plan's, so the outputs are identical."""
    full, plan = _capture("bfloat16", None)
    til = tl.build_tiling(dataclasses.replace(full, seq_lens=np.array([700, 33, 0, 1200], np.int32)), plan,
                          device_split_tokens=S)
    lens = [1500, 2, 64, 2048]
    inp = dataclasses.replace(full, seq_lens=np.array(lens, np.int32))
    replay = sim.run_tiling(inp, plan, sim.with_seq_lens(til, lens))
    fresh = sim.run_twin(inp, inp.plan(f"size:{S}", device="910b2", graph_stable=True, max_splits=CAP))
    np.testing.assert_array_equal(replay[0], fresh[0])
    np.testing.assert_array_equal(replay[1], fresh[1])


def test_graph_mode_refuses_what_it_cannot_replay():
    full, plan = _capture("bfloat16", None)
    first = dataclasses.replace(full, seq_lens=np.array([700, 33, 0, 1200], np.int32))
    with pytest.raises(ValueError, match="graph-stable"):
        tl.build_tiling(first, first.plan(f"size:{S}", device="910b2"), device_split_tokens=S)
    with pytest.raises(ValueError, match="multiple of page_size"):
        tl.build_tiling(first, plan, device_split_tokens=100)
    with pytest.raises(ValueError, match="over device_split_tokens"):
        tl.build_tiling(first, plan, device_split_tokens=128)   # 1200 > 128 * 8


def test_wrapper_graph_mode_takes_new_lengths_from_a_device_tensor():
    """``AscendDecodeWrapper(device_split_tokens=S)``: plan once (the capture), then ``run(seq_lens=...)``
    copies the lengths into the plan buffer on the device and the op follows them, with no plan()
    in between (the op's CPU kernel stands in for the NPU here; it derives the work the same way)."""
    torch = pytest.importorskip("torch")
    from ascend_ops.wrapper import AscendDecodeWrapper
    from splitkv_common.torch_io import to_torch

    full, _ = _capture("bfloat16", None)
    t = to_torch(full, "cpu")
    w = AscendDecodeWrapper(8, 2, 64, 64, dtype=torch.bfloat16, device="cpu", graph_stable=True, max_splits=CAP,
                            device_split_tokens=S)
    assert w.policy == f"size:{S}"
    w.plan([700, 33, 0, 1200], query_start_loc=full.query_start_loc, max_pages=t["block_table"].shape[1],
           num_pages=t["k_cache"].shape[0])
    assert w.tiling["deviceSplitTokens"] == S and "mixed" in w.kernel_reason
    words_before = w._buffers["plan"].clone()
    lens_dev = torch.zeros(4, dtype=torch.int32)
    for lens in ([1500, 2, 64, 2048], [1, 2, 1, 1]):
        lens_dev.copy_(torch.tensor(lens, dtype=torch.int32))
        out, lse = w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], seq_lens=lens_dev)
        ro, rl = dense_attention(dataclasses.replace(full, seq_lens=np.array(lens, np.int32)))
        np.testing.assert_allclose(out.float().numpy(), ro, atol=2e-2, rtol=0)
        ok = np.isfinite(rl)
        np.testing.assert_allclose(lse.numpy()[ok], rl[ok], atol=1e-3, rtol=0)
        off = int(w.tiling["seqLensOffset"])
        changed = np.flatnonzero((w._buffers["plan"] != words_before).numpy())
        assert set(changed.tolist()) <= set(range(off, off + 4)), "only the seqLens section is rewritten"
    w.check_errors()  # lengths within the row: nothing counted
    lens_dev.copy_(torch.tensor([2100, -1, 5, 5], dtype=torch.int32))
    w.run(t["q"], t["k_cache"], t["v_cache"], t["block_table"], seq_lens=lens_dev)
    with pytest.raises(RuntimeError, match=r"2 request\(s\).*past its block-table row.*negative.*First seen: request 0"):
        w.check_errors()
    w.check_errors()  # reset by the call that raised
    with pytest.raises(ValueError, match="graph_stable"):
        AscendDecodeWrapper(8, 2, 64, 64, device="cpu", device_split_tokens=S)
