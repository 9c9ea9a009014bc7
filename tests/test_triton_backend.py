"""The Triton backend through the Triton interpreter (CPU): catalog parity, merge entry, custom ops,
plan/run contract, bad inputs. On a machine with a GPU the same tests run on the GPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import cuda_ref  # noqa: E402  (selects the interpreter without a GPU: before anything imports triton)

pytest.importorskip("triton")
from cuda_ref import backend as tb  # noqa: E402
from cuda_ref import ops  # noqa: E402,F401  (registers torch.ops.splitkv.*)
from cuda_ref.launch import DevicePlan, KernelConfig  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.parity import accuracy, cases  # noqa: E402
from splitkv_common.parity.harness import run_case  # noqa: E402
from splitkv_common.merge import merge_states as np_merge  # noqa: E402
from splitkv_common.reference import dense_attention, plain_attention  # noqa: E402
from splitkv_common.parity.registry import Backend, discover  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

DEVICE = "cpu" if cuda_ref.INTERPRET else "cuda"
SMALL = cases.catalog(("small",))


def _judge(inp, out, lse):
    ro, rl = dense_attention(inp)
    return accuracy.check(out, lse, ro, rl, plain_attention(inp), inp.dtype)


def test_entry_point_names_the_triton_backend():
    be = discover().get("triton")
    assert be is not None and be.unavailable() is None


@pytest.mark.parametrize("case", SMALL, ids=[c.name for c in SMALL])
def test_small_catalog_passes(case):
    res = run_case(tb.triton_backend, case)
    assert res.status == "pass", res.message


FUSED_CASES = cases.catalog(("small",), "seed,policy,mask,empty,multi-query,int8,gqa/5-1")


@pytest.mark.parametrize("variant", ["fused", "fused-n16", "separate-n32", "separate-n128w8s6c",
                                     "fused-n16-column-sum"])
@pytest.mark.parametrize("case", FUSED_CASES, ids=[c.name for c in FUSED_CASES])
def test_kernel_variants_pass(case, variant):
    kw = {"fused": dict(fuse_merge=True),
          "fused-n16": dict(fuse_merge=True, config=KernelConfig(16, 4, 1)),
          "separate-n32": dict(fuse_merge=False, config=KernelConfig(32, 4, 2)),
          # one long item an SM (launch.lone_item), the row sum per tile column (one-row kernels;
          # multi-query cases keep the per-tile sum)
          "separate-n128w8s6c": dict(fuse_merge=False, config=KernelConfig(128, 8, 6, column_sum=True)),
          "fused-n16-column-sum": dict(fuse_merge=True, config=KernelConfig(16, 4, 1, column_sum=True))}[variant]
    be = Backend("triton-" + variant, lambda i, p: tb.run(i, p, **kw), tb._unavailable, tb._unsupported, "h200")
    res = run_case(be, case)
    assert res.status == "pass", res.message


def test_merge_states_op_matches_numpy_merge_with_sentinels():
    g = torch.Generator().manual_seed(0)
    o = torch.randn(5, 7, 3, 80, generator=g)
    lse = torch.randn(5, 7, 3, generator=g) * 10
    lse[0, 0] = float("-inf")           # one empty state
    lse[:, 1] = float("inf")            # a row with every state empty (FA2 / vLLM sentinel)
    lse[2:, 2] = float("-inf")
    o[:, 1] = float("nan")              # an empty state's o is never read
    out, out_lse = torch.ops.splitkv.merge_states(o.to(DEVICE), lse.to(DEVICE))
    ro, rl = np_merge(np.nan_to_num(o.numpy()), lse.numpy())
    np.testing.assert_allclose(out.cpu().numpy(), ro, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.isneginf(out_lse.cpu().numpy()), np.isneginf(rl))
    fin = np.isfinite(rl)
    np.testing.assert_allclose(out_lse.cpu().numpy()[fin], rl[fin], rtol=1e-6, atol=1e-6)
    assert not torch.isnan(out).any() and (out[1] == 0).all()


def _op_args(case_name="multi-query/gqa-bf16", policy="size:32"):
    inp = cases.get_case(case_name).build()
    plan = inp.plan(policy)
    x = to_torch(inp, DEVICE)
    dp = DevicePlan.from_plan(plan, inp.q.shape[1] // inp.k_cache.shape[2], DEVICE)
    data, shape = ops.plan_args(dp)
    return inp, (x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], x["query_start_loc"], data,
                 shape, inp.scale)


def test_decode_op_is_correct_and_passes_opcheck():
    inp, args = _op_args()
    out, lse = torch.ops.splitkv.decode_attention(*args)
    assert _judge(inp, out.float().cpu().numpy(), lse.cpu().numpy()).passed
    torch.library.opcheck(torch.ops.splitkv.decode_attention.default, args)
    o = torch.randn(3, 4, 2, 64)
    torch.library.opcheck(torch.ops.splitkv.merge_states.default, (o.to(DEVICE), torch.randn(3, 4, 2).to(DEVICE)))


def test_decode_op_takes_the_plans_longest_request_from_plan_shape():
    # plan_args' ninth entry (most query rows per request) lets the one-row kernel run; 8 entries
    # (unknown) keep the kernel that handles several rows: the same values either way
    inp, args = _op_args("seed/worked-example")
    shape = args[7]
    assert len(shape) == 10 and shape[8] == int(np.diff(inp.query_start_loc).max())
    out9, lse9 = torch.ops.splitkv.decode_attention(*args[:7], shape[:9], args[8])
    out8, lse8 = torch.ops.splitkv.decode_attention(*args[:7], shape[:8], args[8])
    assert _judge(inp, out9.float().cpu().numpy(), lse9.cpu().numpy()).passed
    torch.testing.assert_close(out9, out8, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="plan_shape: must be 8 to 10 sizes"):
        torch.ops.splitkv.decode_attention(*args[:7], shape + [1], args[8])


def test_torch_compile_traces_the_ops_through_fake_kernels():
    inp, args = _op_args()
    f = torch.compile(lambda *a: torch.ops.splitkv.decode_attention(*a)[0].float() * 2, backend="aot_eager",
                      fullgraph=True)
    eager = torch.ops.splitkv.decode_attention(*args)[0].float() * 2
    assert torch.equal(f(*args), eager)


def _wrapper_for(inp, **kw):
    T, Hq, D = inp.q.shape
    _, page, Hkv, _ = inp.k_cache.shape
    kvd = "int8" if inp.kv_dtype == "int8" else inp.dtype
    return DecodeWrapper(Hq, Hkv, D, page, dtype=inp.dtype, kv_dtype=kvd, device=DEVICE, **kw)


@pytest.mark.parametrize("fuse", [False, True])
def test_graph_stable_plan_refreshes_in_place_as_lengths_change(fuse):
    inp = cases.random_inputs(3, [70, 33, 5, 120], q_lens=[1, 2, 1, 3], num_q_heads=6, num_kv_heads=2,
                              page_size=8)
    w = _wrapper_for(inp, policy="size:16", graph_stable=True, max_splits=16, fuse_merge=fuse)
    x = to_torch(inp, DEVICE)
    w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
    out, lse = w.run(**x, scale=inp.scale)
    ptrs = (out.data_ptr(), lse.data_ptr(), w.dplan.data.data_ptr())
    rng = np.random.default_rng(1)
    for _ in range(3):
        lens = rng.integers(0, inp.seq_lens + 1).astype(np.int32)
        w.plan(lens, query_start_loc=inp.query_start_loc)
        x["seq_lens"].copy_(torch.from_numpy(lens))
        out.fill_(float("nan"))  # every element must be written again
        out2, lse2 = w.run(**x, scale=inp.scale)
        assert (out2.data_ptr(), lse2.data_ptr(), w.dplan.data.data_ptr()) == ptrs
        new = dataclasses.replace(inp, seq_lens=lens)
        acc = _judge(new, out2.float().cpu().numpy(), lse2.cpu().numpy())
        assert acc.passed, acc.reason


@pytest.mark.parametrize("length, head_dim, split", [
    (150, 32, 32),
    (2100, 64, 1024),   # D 64 with splits of 1024 tokens: 128-token tiles (default_config)
])
def test_fixed_split_size_is_bitwise_batch_invariant(length, head_dim, split, monkeypatch):
    from cuda_ref import launch

    tiles = []
    choose = launch.default_config
    monkeypatch.setattr(launch, "default_config", lambda *a: tiles.append(choose(*a).block_n) or choose(*a))
    kw = dict(num_q_heads=8, num_kv_heads=2, head_dim=head_dim, dtype="bfloat16")
    target = cases.random_inputs(5, [length], **kw)
    got = []
    for extra_first, extra in (([], []), ([40, 0], [7]), ([], [300, 1, 99])):
        lens = extra_first + [length] + extra
        inp = cases.random_inputs(9, lens, **kw)
        b = len(extra_first)
        q, k, v = inp.q.copy(), inp.k_cache.copy(), inp.v_cache.copy()
        q[b] = target.q[0]
        n = -(-length // 16)
        k[inp.block_table[b, :n]] = target.k_cache[target.block_table[0, :n]]
        v[inp.block_table[b, :n]] = target.v_cache[target.block_table[0, :n]]
        inp = dataclasses.replace(inp, q=q, k_cache=k, v_cache=v)
        out, lse = tb.run(inp, inp.plan(f"size:{split}"))
        acc = _judge(inp, out, lse)
        assert acc.passed, acc.reason
        got.append((out[b].view(np.uint32).copy(), lse[b].view(np.uint32).copy()))
    for o, l in got[1:]:
        np.testing.assert_array_equal(o, got[0][0])
        np.testing.assert_array_equal(l, got[0][1])
    assert set(tiles) == {128 if head_dim == 64 else 64}


def test_graph_stable_plans_take_the_configuration_of_their_valid_items(monkeypatch):
    # a graph-stable plan's padding items return at once, so the kernel configuration is chosen for
    # the valid items of the plan its buffer was made for (DevicePlan.config_items), not the padded
    # capacity: the same configuration, hence the same bits, as the plan without padding; the ops
    # path (plan_args' tenth entry) chooses the same
    from cuda_ref import launch

    seen = []
    choose = launch.default_config
    monkeypatch.setattr(launch, "default_config", lambda *a: seen.append(a[2]) or choose(*a))
    inp = cases.random_inputs(4, [300, 37, 0], num_q_heads=8, num_kv_heads=2, head_dim=64, dtype="bfloat16")
    plain = inp.plan("size:64")
    stable = inp.plan("size:64", graph_stable=True, max_work_items=launch._FEW_ITEMS + 40)
    assert plain.num_items == stable.num_valid_items <= launch._FEW_ITEMS < stable.num_items
    got = [tb.run(inp, p) for p in (plain, stable)]
    assert seen == [plain.num_items, plain.num_items]
    for a, b in zip(*got):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
    w = DecodeWrapper(8, 2, 64, 16, dtype="bfloat16", graph_stable=True)
    w.set_plan(stable)
    data, shape = ops.plan_args(w.dplan)
    assert shape[9] == stable.num_valid_items
    x = to_torch(inp, w.device)
    seen.clear()
    out, _ = torch.ops.splitkv.decode_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                                x["query_start_loc"], data, shape, inp.scale)
    assert seen == [plain.num_items]
    np.testing.assert_array_equal(out.float().cpu().numpy().view(np.uint32),
                                  got[0][0].astype(np.float32).view(np.uint32))


def test_only_graph_stable_plans_compile_the_padding_test():
    # the test that returns a padding item after one load costs a round trip before a real item's
    # loads: compiled where a plan has padding (graph-stable host plans) and nowhere else
    inp = cases.random_inputs(5, [90, 0, 33], num_q_heads=4, num_kv_heads=2, head_dim=32, dtype="bfloat16")
    x = to_torch(inp, DEVICE)
    got = {}
    for stable in (False, True):
        w = DecodeWrapper(4, 2, 32, 16, dtype="bfloat16", graph_stable=stable, policy="size:32", device=DEVICE)
        w.plan(inp.seq_lens, query_start_loc=inp.query_start_loc)
        out, _ = w.run(**x, scale=inp.scale)
        got[stable] = (w.last_launch.constexprs["PADDED"], out.float().cpu().numpy())
    assert got[True][0] is True and got[False][0] is False
    np.testing.assert_array_equal(got[True][1].view(np.uint32), got[False][1].view(np.uint32))


def test_fused_and_separate_merge_agree_bitwise():
    # both merges are kernels._merge_row over the same [CHUNK, BLOCK_D] tiles (launch.merge_chunk)
    inp = cases.random_inputs(3, [700, 45, 0, 333], q_lens=[1, 2, 1, 1], num_q_heads=8, num_kv_heads=2,
                              head_dim=64, dtype="bfloat16")
    plan = inp.plan("size:16")
    assert plan.max_splits > 32  # rows of more than one chunk: the running max across chunks
    fused = tb.run(inp, plan, fuse_merge=True)
    separate = tb.run(inp, plan, fuse_merge=False)
    for a, b in zip(fused, separate):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_the_separate_merge_splits_the_head_dim(monkeypatch):
    """``launch.merge_d_parts``: 64 head-dim columns a merge program (two at D 128, four at D 256, one
    at D 64 and below), a function of the head dim alone; the parts give the one program's result
    (bit for bit in the interpreter, whose sums do not depend on the tile; to float32 rounding on a
    GPU, where the tile decides the order of the sums), and match the reference."""
    from cuda_ref import launch
    assert [launch.merge_d_parts(b) for b in (16, 32, 64, 128, 256)] == [1, 1, 1, 2, 4]
    for d, parts in ((128, 2), (256, 4)):
        inp = cases.random_inputs(5, [300, 45, 0, 129], q_lens=[1, 2, 1, 1], num_q_heads=4, num_kv_heads=2,
                                  head_dim=d, dtype="float32")
        plan = inp.plan("size:32")
        x = to_torch(inp, DEVICE)
        got = {}
        for p in (parts, 1):
            monkeypatch.setattr(launch, "merge_d_parts", lambda block_d, p=p: p)
            w = DecodeWrapper(4, 2, d, inp.k_cache.shape[1], dtype="float32", device=DEVICE)
            w.set_plan(plan)
            out, lse = w.run(**x, scale=inp.scale)
            assert w.last_launch.merge.grid[2] == p
            got[p] = (out.cpu().numpy().copy(), lse.cpu().numpy().copy())
        for a, b in zip(got[parts], got[1]):
            if cuda_ref.INTERPRET:
                np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
            else:
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        assert _judge(inp, *got[parts]).passed


def test_default_config_keeps_tile_and_warps_for_batch_invariant_plans():
    from cuda_ref.launch import default_config
    for d, kv_bytes in ((64, 2), (128, 2), (256, 2), (128, 4), (96, 4)):
        for split in (0, 512, 1024, 8192):   # a fixed-size plan's split length is a property of the plan
            few = default_config(d, kv_bytes, 10, True, split)
            for n in (300, 384, 512, 640, 768, 1024, 1280, 100_000):   # the stages may follow the waves
                many = default_config(d, kv_bytes, n, True, split)
                assert (few.block_n, few.num_warps, few.column_sum) == (many.block_n, many.num_warps, False)


def test_default_config_fills_the_waves_at_d128():
    """16-bit D 128, more than "few" items: ``auto`` plans of 265 to 2,112 items run one-warp programs
    on 16-token tiles (n16w1s5); otherwise the configuration whose waves (programs an H200 holds at
    once: 4, 5, 3, 2 an SM for n32w2s5, n32w4s5, n64w4s5, n64w4s7) the items fill best, the one of more
    programs within 2 %; batch-invariant plans choose only the stages; past 1,320 items (or an unknown
    count) the choice before; other head dims and dtypes as before."""
    from cuda_ref.launch import default_config, fullest_waves

    def cfg(n, invariant=False, d=128, kv_bytes=2):
        return str(default_config(d, kv_bytes, n, invariant, 2048))

    assert cfg(200) == cfg(200, True) == "n64w4s5"                          # few
    assert cfg(264) == "n64w4s5" and cfg(265) == cfg(1024) == cfg(2112) == "n16w1s5"
    assert cfg(2113) == cfg(100_000) == cfg(0) == "n32w2s5"
    assert [fullest_waves(n) for n in (384, 512, 640, 768, 1024, 1280)] == \
        [(64, 4, 5), (32, 2, 5), (32, 4, 5), (64, 4, 5), (32, 2, 5), (32, 4, 5)]  # 396, 528, 660, 792, 1056, 1320
    assert [cfg(n, True) for n in (384, 512, 640, 768, 1024)] == ["n64w4s5", "n64w4s7", "n64w4s5", "n64w4s5", "n64w4s7"]
    assert cfg(1321, True) == cfg(0, True) == "n64w4s7"
    assert cfg(640, d=64) == "n32w2s7" and cfg(640, True, d=64) == "n128w4s7"   # long items at D 64
    assert cfg(640, kv_bytes=4) == "n32w8s7" and cfg(640, d=256) == "n32w4s7"


def test_default_config_runs_one_long_item_an_sm_with_deeper_tiles():
    """``launch.lone_item``: an ``auto`` plan at 16-bit D 128 of at most one item an SM, the longest
    of 1,024 tokens or more, takes 128-token tiles, 8 warps and 6 stages (run 55) with the row sum
    kept per tile column (run 77); its longest item
    is :attr:`DevicePlan.item_tokens` (``plan_item_tokens``); batch-invariant plans, more items,
    shorter items, other head dims and dtypes do not; plans on either side get their own launch."""
    from cuda_ref.launch import DevicePlan, default_config, plan_item_tokens, plan_launch_key
    from splitkv_common.plan import make_plan
    assert str(default_config(128, 2, 128, False, 1024)) == str(default_config(128, 2, 132, False, 8192)) == "n128w8s6c"
    for args in ((128, 2, 128, True, 1024), (128, 2, 133, False, 1024), (128, 2, 128, False, 1023),
                 (64, 2, 128, False, 4096), (128, 4, 128, False, 4096), (128, 2, 0, False, 4096)):
        assert not str(default_config(*args)).startswith("n128w8s6"), args

    def plan(seq, **kw):
        return make_plan(np.array(seq), num_kv_heads=8, num_q_heads=32, head_dim=128, page_size=16, device="h200",
                         **kw)

    unsplit = plan([1024] * 15 + [1100])
    assert unsplit.split_tokens == 0 and plan_item_tokens(unsplit) == 1100
    assert plan_item_tokens(plan([1024] * 16, policy="none")) == 0
    stable = plan([1024] * 16, graph_stable=True)
    assert plan_item_tokens(stable) == stable.split_tokens > 0
    one = plan([16384])
    assert plan_item_tokens(one) == one.split_tokens == 512

    def key(n, tokens):
        return plan_launch_key(DevicePlan(torch.zeros(1, dtype=torch.int32), n, 16, 16, 16, 1, 16, 1, False,
                                          item_tokens=tokens), torch.device("cpu"))
    assert key(128, 1024) != key(128, 512) and key(128, 1024) != key(133, 1024)


def test_the_planner_costs_one_item_an_sm_where_the_launch_takes_its_configuration():
    """``DeviceProfile.lone_*`` is read by the planner and by ``launch.lone_item`` alike: at B 16 x 1k
    (128 items) the unsplit candidate gets the one-item bandwidth exactly where the launch would give
    the plan the deeper tiles (16-bit D 128), not at other shapes of the same bytes a token (D 256
    int8, D 64 float32)."""
    from cuda_ref.launch import lone_item
    from splitkv_common.devices import get_profile
    from splitkv_common.plan import make_plan
    prof = get_profile("h200")
    for d, elem in ((128, 2), (256, 1), (64, 4), (128, 1), (128, 4)):
        est = make_plan(np.full(16, 1024), num_kv_heads=8, num_q_heads=32, head_dim=d, kv_elem_bytes=elem,
                        page_size=16, device="h200").estimates_us[0]["attention_us"]
        tb = d * 2 * elem
        lone = prof.launch_us + max(1024 * tb / (prof.lone_unit_bandwidth_gbps * 1e3),
                                    128 * 1024 * tb / (prof.bandwidth_gbps * 1e3)) + prof.item_overhead_us
        launch_bytes = 4 if elem != 2 else 2   # default_config's kv_bytes: int8 and float32 as 4
        assert (est == round(lone, 3)) == lone_item(d, launch_bytes, 128, False, 1024) == ((d, elem) == (128, 2))


def test_plans_whose_item_counts_choose_other_configurations_get_their_own_launch():
    # the prepared launch is shared by plans of equal launch keys: the key holds the configurations
    # the item count decides (`auto`'s and a batch-invariant plan's), so a plan of 640 items does not
    # run with a 512-item plan's, nor one of 265 with a "few" plan's or one of 2,113 with n16w1s5
    from cuda_ref.launch import DevicePlan, plan_launch_key

    def key(n, config_items=0):
        return plan_launch_key(DevicePlan(torch.zeros(4, dtype=torch.int32), n, 4, 4, 8, 8, 16, 1, False,
                                          config_items=config_items), torch.device("cpu"))

    assert key(264) != key(265) and key(512) != key(640) and key(2112) != key(2113)
    assert key(600) == key(640) and key(100) == key(200)
    assert key(2112, config_items=200) == key(200)


def test_default_config_long_items_at_d64_take_128_token_tiles():
    """16 KiB of K per tile: 128 tokens at 16-bit D 64 where the plan's split length is at least 1024
    (measured faster there), 64 below and at every other head dim."""
    from cuda_ref.launch import default_config
    assert default_config(64, 2, 256, False, 2048).block_n == 128
    assert default_config(64, 2, 256, True, 1024).block_n == 128
    assert default_config(64, 2, 256, False, 512).block_n == 64
    assert default_config(64, 2, 256, False, 0).block_n == 64      # no split length: the request's own
    assert default_config(128, 2, 256, False, 8192).block_n == 64
    assert default_config(64, 4, 256, False, 8192).block_n == 64   # int8 KV (passed as 4 bytes) or float32


def test_default_config_sums_per_tile_column_where_measured_faster():
    """The row sum per tile column: ``auto`` plans of few items at 16-bit D 64 (run 79) and of one
    long item an SM at 16-bit D 128 (run 77); not at D 128 / D 256 with few items, not for many items,
    not for batch-invariant plans (whose order of sums must not follow the batch's item count)."""
    from cuda_ref.launch import default_config
    assert default_config(64, 2, 256, False, 512).column_sum and default_config(64, 2, 256, False, 2048).column_sum
    assert default_config(128, 2, 128, False, 2048).column_sum          # one item an SM
    for args in ((64, 2, 256, True, 512), (64, 2, 1000, False, 512), (64, 4, 256, False, 512),
                 (128, 2, 256, False, 512), (256, 2, 128, False, 512), (128, 2, 1000, False, 512)):
        assert not default_config(*args).column_sum, args


# -- bad input: clear errors before any launch ------------------------------------------------------

@pytest.fixture
def ready():
    inp = cases.get_case("basic/vector-v-float16").build()
    w = _wrapper_for(inp, policy="size:32")
    w.plan(inp.seq_lens)
    return inp, w, to_torch(inp, DEVICE)


def test_wrong_q_dtype_raises(ready):
    inp, w, x = ready
    x["q"] = x["q"].float()
    with pytest.raises(TypeError, match="q: dtype"):
        w.run(**x)


def test_int64_block_table_raises(ready):
    inp, w, x = ready
    x["block_table"] = x["block_table"].long()
    with pytest.raises(TypeError, match="block_table"):
        w.run(**x)


def test_non_contiguous_head_dim_raises(ready):
    inp, w, x = ready
    x["q"] = torch.empty(x["q"].shape[:2] + (2 * x["q"].shape[2],), dtype=x["q"].dtype, device=DEVICE)[..., ::2]
    with pytest.raises(ValueError, match="contiguous"):
        w.run(**x)


def test_tensor_on_another_device_raises(ready):
    inp, w, x = ready
    x["seq_lens"] = x["seq_lens"].to("meta")
    with pytest.raises(ValueError, match="seq_lens: on meta"):
        w.run(**x)


def test_block_table_out_of_range_raises_with_validate(ready):
    inp, w, x = ready
    x["block_table"][0, 0] = inp.k_cache.shape[0] + 5
    with pytest.raises(ValueError, match=r"block_table: entry \[0, 0\]"):
        w.run(**x, validate=True)


def test_plan_for_another_batch_raises(ready):
    inp, w, x = ready
    x["seq_lens"] = x["seq_lens"] - 1  # lengths the plan was not made for
    with pytest.raises(ValueError, match="plan: covers"):
        w.run(**x, validate=True)
    w.plan(np.array([5, 6], np.int32))  # two requests: the batch has three
    with pytest.raises(ValueError, match="plan: made for 2 requests"):
        w.run(**to_torch(inp, DEVICE))


def test_backend_rejects_unsupported_head_dim():
    inp = cases.random_inputs(0, [10], head_dim=8)
    assert tb._unsupported(inp) is not None
    with pytest.raises(ValueError, match="head dim 8"):
        tb.run(inp, inp.plan("none"))


def test_run_before_plan_raises():
    w = DecodeWrapper(4, 2, 64, 16, dtype="float32", device=DEVICE)
    with pytest.raises(RuntimeError, match="plan"):
        w.run(*[torch.zeros(1)] * 5)
