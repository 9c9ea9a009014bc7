"""Context-parallel decode over torch.distributed with gloo: 2 and 4 spawned CPU processes, each
holding only its own pages, one collective per step, judged against the float64 reference of the
unsharded batch. Tiny shapes: the whole file takes seconds, most of it process start-up."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from splitkv_common.parity.accuracy import check  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402
from splitkv_common.parity.cases import random_inputs  # noqa: E402
from splitkv_common.context_parallel import ContextParallelDecode, cp_decode, launch_local  # noqa: E402
from splitkv_common.cp_sharding import LAYOUTS, localize, shard  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed is not available")

CASES = {
    "ragged-with-empty-gqa": dict(seed=1, seq_lens=[0, 37, 100, 5], q_lens=[1, 3, 2, 4], num_q_heads=8,
                                  num_kv_heads=2, page_size=4),
    "window-multi-query": dict(seed=2, seq_lens=[60, 9, 33], q_lens=[5, 2, 1], window_left=7, page_size=4),
    "short-requests-empty-shards": dict(seed=3, seq_lens=[3, 0, 17], q_lens=[2, 1, 1], page_size=16),
    "bf16-window-gqa": dict(seed=4, seq_lens=[70, 1], q_lens=[2, 1], num_q_heads=8, num_kv_heads=2,
                            dtype="bfloat16", window_left=20, page_size=8),
}


def _inputs(name):
    kw = dict(CASES[name])
    return random_inputs(kw.pop("seed"), kw.pop("seq_lens"), head_dim=16, **kw)


def _worker(rank, world):
    """Every case x layout x mode on this rank; returns {(case, layout, mode): (out, lse, heads)}."""
    results = {}
    for name in CASES:
        inp = _inputs(name)
        x = to_torch(inp)
        for layout in LAYOUTS:
            s = shard(inp.block_table, inp.seq_lens, rank, world, layout, page_size=inp.k_cache.shape[1])
            s, k, v = localize(s, x["k_cache"], x["v_cache"])  # this rank keeps only its own pages
            kw = dict(query_start_loc=x["query_start_loc"], scale=inp.scale, window_left=inp.window_left)
            out, lse = cp_decode(x["q"], k, v, s, **kw)
            results[(name, layout, "all_gather")] = (out.float().numpy(), lse.numpy(), (0, inp.q.shape[1]))
            if inp.q.shape[1] % world == 0:
                out, lse = cp_decode(x["q"], k, v, s, mode="all_to_all", **kw)
                h = ContextParallelDecode(mode="all_to_all").heads(inp.q.shape[1])
                results[(name, layout, "all_to_all")] = (out.float().numpy(), lse.numpy(), (h.start, h.stop))
    return results


@pytest.mark.parametrize("world", [2, 4])
def test_cp_decode_gloo(world):
    per_rank = launch_local(_worker, world, backend="gloo", timeout_s=60)
    refs = {}
    for name in CASES:
        inp = _inputs(name)
        refs[name] = (inp, *dense_attention(inp), plain_attention(inp))
    checked = 0
    for key in per_rank[0]:
        name, layout, mode = key
        inp, ref_o, ref_l, plain = refs[name]
        if mode == "all_gather":
            out, lse, _ = per_rank[0][key]
            for r in range(1, world):  # every rank merged the same gathered states
                np.testing.assert_array_equal(per_rank[r][key][0], out)
        else:  # each rank ends with its heads; together they are the whole output
            out = np.concatenate([per_rank[r][key][0] for r in range(world)], axis=1)
            lse = np.concatenate([per_rank[r][key][1] for r in range(world)], axis=1)
            assert [per_rank[r][key][2] for r in range(world)] == [
                (r * inp.q.shape[1] // world, (r + 1) * inp.q.shape[1] // world) for r in range(world)]
        acc = check(out, lse, ref_o, ref_l, plain, inp.dtype)
        assert acc.passed, f"{key}: {acc.reason}"
        assert not np.isnan(out).any() and not np.isnan(lse).any()
        checked += 1
    assert checked == len(CASES) * len(LAYOUTS) * 2


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_bench_cpu_smoke(tmp_path, backend):
    """``python -m splitkv_bench context-parallel --cpu``: gloo, 1 and 2 processes, tiny sizes, each rank on stock
    torch ops or the Triton kernels (interpreter); the JSON has every point, the bytes per rank and a
    passing correctness check."""
    if backend == "triton":
        pytest.importorskip("triton")
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    points = [(1, 300), (2, 300)] if backend == "torch" else [(2, 40)]  # the interpreter is slow
    gpus = ",".join(sorted({str(w) for w, _ in points}))
    contexts = ",".join(sorted({str(c) for _, c in points}, key=int))
    r = subprocess.run([sys.executable, "-m", "splitkv_bench", "context-parallel", "--cpu", "--gpus", gpus, "--contexts",
                        contexts, "--iters", "1", "--backend", backend, "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=root)
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads((tmp_path / "bench_context_parallel.json").read_text())
    assert [(x["world"], x["context"]) for x in res["results"]] == points
    for x in res["results"]:
        assert x["check"]["passed"]
        assert x["comm_send_bytes_per_rank"] == (0 if x["world"] == 1 else 4 * 17 * 4)  # Hq 4, D 16: Hq (D + 1) floats
        assert sum(p["local_tokens"] for p in x["per_rank"]) == x["context"]
        assert set(x["views"]) == {"local" if backend == "triton" else "global"}
    assert "provenance" in res and (tmp_path / "bench_context_parallel.md").is_file()
    assert "| GPUs | context |" in r.stdout


def test_bench_refuses_without_gpu(tmp_path):
    """Without --cpu on a machine without CUDA: one line and exit code 2, no traceback."""
    import subprocess
    import sys
    from pathlib import Path

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = subprocess.run([sys.executable, "-m", "splitkv_bench", "context-parallel", "--gpus", "1,2", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 2 and "no CUDA device" in r.stderr and "Traceback" not in r.stderr
