"""The launch fast path (``cuda_ref.fast_launch``) on the CPU: the interpreter takes the normal launch
and ``run()``'s results do not change; the arguments the fast path hands the compiled kernel's
launcher equal what Triton's own binder (generated from the real kernels' signatures) binds, checked
against a fake compiled kernel that records its calls; the per-call fallbacks and the switches."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import cuda_ref  # noqa: E402  (selects the interpreter without a GPU: before anything imports triton)

triton = pytest.importorskip("triton")
from cuda_ref import fast_launch, kernels  # noqa: E402
from cuda_ref.launch import DevicePlan, prepare_decode  # noqa: E402
from cuda_ref.wrapper import DecodeWrapper  # noqa: E402
from splitkv_common.parity import cases  # noqa: E402
from splitkv_common.plan import make_plan  # noqa: E402
from splitkv_common.torch_io import to_torch  # noqa: E402

DEVICE = "cpu" if cuda_ref.INTERPRET else "cuda"


def _run_twice(monkeypatch, fast: str, soft_cap=None):
    monkeypatch.setenv(fast_launch.ENV, fast)
    inp = cases.random_inputs(3, [70, 9, 33], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device=DEVICE, policy="size:16")
    w.plan(inp.seq_lens)
    x = to_torch(inp, DEVICE)
    first = [t.clone() for t in w.run(**x, soft_cap=soft_cap)]
    second = [t.clone() for t in w.run(**x, soft_cap=soft_cap)]
    return w, first, second


@pytest.mark.skipif(not cuda_ref.INTERPRET, reason="the interpreter's fallback")
def test_interpreter_takes_the_normal_launch_and_results_do_not_change(monkeypatch):
    w_on, on1, on2 = _run_twice(monkeypatch, "1")
    state = w_on.last_launch.fast
    assert state["fast"] is False and "interpreter" in state["reason"]
    assert w_on.last_launch.merge is not None  # both launches went through the fallback
    w_off, off1, _ = _run_twice(monkeypatch, "0")
    assert w_off.last_launch.fast["fast"] is False
    for a, b, c in zip(on1, on2, off1):
        assert torch.equal(a, b) and torch.equal(a, c)


# -- the argument assembly against Triton's binder, with a fake compiled kernel ------------------------


class _FakeCompiled:
    """A compiled kernel whose launcher records its calls."""

    def __init__(self, params):
        self.calls = []
        self.run = lambda *a: self.calls.append(a)
        self.function = 0xF00
        self.packed_metadata = (4, 1, 0)
        self.src = type("Src", (), {"signature": {p.name: "?" for p in params}})()


class _FakeJIT:
    """``JITFunction`` stand-in over a real kernel's parameters: ``fn[grid](...)`` binds with
    Triton's own binder (generated from the signature for sm_90), caches a fake compiled kernel
    under Triton's cache key and records what ``JITFunction.run`` would hand its launcher."""

    def __init__(self, kernel):
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature

        raw = getattr(kernel, "fn", kernel)
        # the kernel's do_not_specialize (a JITFunction's attribute, the interpreter's decorator kwargs)
        dns = getattr(kernel, "do_not_specialize", None) or getattr(kernel, "kwargs", {}).get("do_not_specialize")
        jf = raw if isinstance(raw, JITFunction) else JITFunction(raw, do_not_specialize=dns)
        self.params, self.debug, self.pre_run_hooks = jf.params, False, []
        self.binder = create_function_from_signature(jf.signature, jf.params, make_backend(GPUTarget("cuda", 90, 32)))
        self.kernel_cache, self.key_cache = {}, {}
        self.device_caches = {0: (self.kernel_cache, self.key_cache, None, None, self.binder)}
        self.compiled = _FakeCompiled(jf.params)
        self.normal_launches = []   # the values Triton's run() passes after the hooks, per normal launch

    def __getitem__(self, grid):
        from triton import knobs
        from triton.runtime.jit import compute_cache_key

        def runner(*args, **kwargs):
            kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
            kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
            bound, spec, options = self.binder(*args, **kwargs)
            self.kernel_cache[compute_cache_key(self.key_cache, spec, options)] = self.compiled
            self.normal_launches.append((tuple(grid), list(bound.values())))
            return self.compiled
        return runner


@pytest.fixture
def gpu_free(monkeypatch):
    """The fast path's device calls, answered without a GPU (device 0, stream handle 77)."""
    monkeypatch.setattr(fast_launch, "interpreting", lambda: False)
    monkeypatch.setenv(fast_launch.ENV, "1")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(fast_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: 77, raising=False)


def _wide(block_table, columns=32):
    """The block table padded to ``columns`` columns (page 0: valid), as a server's fixed-width table."""
    return torch.nn.functional.pad(block_table, (0, columns - block_table.shape[1]))


def _decode_launch(fuse=False, soft_cap=None, window=None, int8=False, lens=(50, 17)):
    """A real prepared stage-1 + merge launch (the wrapper's shapes) and its tensors."""
    B = len(lens)
    inp = cases.random_inputs(B, list(lens), num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    x = to_torch(inp, "cpu")
    x["block_table"] = _wide(x["block_table"])
    if int8:
        x["k_cache"] = x["k_cache"].to(torch.int8)
        x["v_cache"] = x["v_cache"].to(torch.int8)
        x["k_scale"] = torch.ones(2, dtype=torch.float32)
        x["v_scale"] = torch.ones(2, dtype=torch.float32)
    plan = make_plan(inp.seq_lens, num_kv_heads=2, page_size=8, policy="size:16", num_q_heads=4)
    dp = DevicePlan.from_plan(plan, group=2, device="cpu")
    T, Hq, D = x["q"].shape
    out, lse = torch.empty(T, Hq, D), torch.empty(T, Hq)
    part_o, part_lse = torch.empty(plan.num_slots, Hq, D), torch.empty(plan.num_slots, Hq)
    counters, errors = torch.zeros(64, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    qsl = torch.arange(B + 1, dtype=torch.int32)
    args = (x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"], qsl, dp, out, lse, part_o, part_lse,
            counters)
    scales = dict(k_scale=x.get("k_scale"), v_scale=x.get("v_scale"))
    prep = prepare_decode(*args, scale=0.2, soft_cap=soft_cap, window_left=window, fuse_merge=fuse, errors=errors,
                          pdl=True, **scales)
    call = (*args, scales["k_scale"], scales["v_scale"], None, None, errors)
    return prep, call


def _check_against_triton(fake: _FakeJIT, fl: fast_launch.FastLaunch, tensors):
    """Two calls: the first normal (Triton's values recorded), the second through the fake launcher;
    its values equal Triton's with each tensor replaced by its address."""
    fl(*tensors)
    assert fl.fast is True, fl.reason
    fl(*tensors)
    assert len(fake.normal_launches) == 1 and len(fake.compiled.calls) == 1
    grid, expected = fake.normal_launches[0]
    got = fake.compiled.calls[0]
    g = grid + (1,) * (3 - len(grid))
    assert got[:9] == (*g, 77, 0xF00, (4, 1, 0), None, None, None)
    values = got[9:]
    assert len(values) == len(expected) == len(fake.params)
    slots = set(fl.tensor_slots)
    for i, (v, e) in enumerate(zip(values, expected)):
        if i in slots:
            assert isinstance(e, torch.Tensor) and v == e.data_ptr(), (i, fake.params[i].name)
        else:
            assert type(v) is type(e) and v == e, (i, fake.params[i].name, v, e)
    return expected


@pytest.mark.parametrize("variant", [dict(), dict(fuse=True), dict(soft_cap=30.0, window=5), dict(int8=True)])
def test_stage1_values_match_what_triton_binds(gpu_free, monkeypatch, variant):
    prep, call = _decode_launch(**variant)
    fake = _FakeJIT(kernels.split_kv_kernel)
    fl = fast_launch.FastLaunch(fake, prep.grid, prep.stage1.positional, prep.stage1.tensor_slots, prep.constexprs)
    expected = _check_against_triton(fake, fl, prep.tensors(*call))
    names = [p.name for p in fake.params]
    # constexprs given by name and those left to their defaults are in the launcher's arguments too
    assert expected[names.index("FUSE_MERGE")] == variant.get("fuse", False)
    assert expected[names.index("DEVICE_PLAN")] is False


def test_a_launch_of_a_compiled_specialization_is_fast_from_its_first_call(gpu_free):
    prep, call = _decode_launch()
    fake = _FakeJIT(kernels.split_kv_kernel)
    tensors = prep.tensors(*call)
    first = fast_launch.FastLaunch(fake, prep.grid, prep.stage1.positional, prep.stage1.tensor_slots, prep.constexprs)
    first(*tensors)
    assert first.fast and len(fake.normal_launches) == 1 and not fake.compiled.calls
    # another prepared launch (another grid) of the same kernel specialization: found in the cache
    grid = (prep.grid[0] + 5, prep.grid[1])
    other = fast_launch.FastLaunch(fake, grid, prep.stage1.positional, prep.stage1.tensor_slots, prep.constexprs)
    other(*tensors)
    assert other.fast and len(fake.normal_launches) == 1 and len(fake.compiled.calls) == 1
    assert fake.compiled.calls[0][:3] == (*grid, 1)
    # another specialization (another constexpr): not compiled yet, so launched normally first
    third = fast_launch.FastLaunch(fake, grid, prep.stage1.positional, prep.stage1.tensor_slots,
                                   {**prep.constexprs, "BOUNDS": False})
    third(*tensors)
    assert third.fast and len(fake.normal_launches) == 2 and len(fake.compiled.calls) == 1


def test_merge_values_match_what_triton_binds_with_tensors_between_scalars(gpu_free):
    prep, call = _decode_launch()
    m = prep.merge
    assert m is not None and m.constexprs.get("launch_pdl") is True
    fake = _FakeJIT(kernels.merge_kernel)
    fl = fast_launch.FastLaunch(fake, m.grid, m.call.positional, m.call.tensor_slots, m.constexprs)
    q, k, v, bt, seq_lens, qsl, dp, out, lse, part_o, part_lse = call[:11]
    tensors = (part_o, part_lse, out, lse, dp.view("row_slot_start"), dp.view("row_num_splits"), seq_lens, qsl)
    expected = _check_against_triton(fake, fl, tensors)
    names = [p.name for p in fake.params]
    assert expected[names.index("SEQ_LENS")] is seq_lens and expected[names.index("NUM_SLOTS")] == part_o.shape[0]


def _ready_fast(monkeypatch):
    prep, call = _decode_launch()
    fake = _FakeJIT(kernels.split_kv_kernel)
    fl = fast_launch.FastLaunch(fake, prep.grid, prep.stage1.positional, prep.stage1.tensor_slots, prep.constexprs)
    tensors = prep.tensors(*call)
    fl(*tensors)
    assert fl.fast is True
    return fake, fl, tensors


def test_fresh_tensors_each_call_and_a_misaligned_one_takes_the_normal_launch(gpu_free, monkeypatch):
    fake, fl, tensors = _ready_fast(monkeypatch)
    q2 = tensors[0].clone()
    fl(q2, *tensors[1:])
    assert fake.compiled.calls[-1][9] == q2.data_ptr() != tensors[0].data_ptr()
    shifted = torch.empty(tensors[0].numel() + 1, dtype=tensors[0].dtype)[1:].view(tensors[0].shape)
    fl(shifted, *tensors[1:])   # 4 bytes off: Triton specializes on 16-byte alignment
    assert fl.slow_calls == 1 and len(fake.normal_launches) == 2 and len(fake.compiled.calls) == 1


def test_an_installed_launch_hook_takes_the_normal_launch(gpu_free, monkeypatch):
    from triton import knobs
    fake, fl, tensors = _ready_fast(monkeypatch)
    hook = knobs.runtime.launch_enter_hook
    if not hasattr(hook, "add"):
        pytest.skip("launch hooks are not hook chains in this Triton")
    seen = []
    hook.add(seen.append)
    try:
        fl(*tensors)
    finally:
        hook.remove(seen.append)
    assert fl.slow_calls == 1 and len(fake.compiled.calls) == 0
    fl(*tensors)
    assert len(fake.compiled.calls) == 1


@pytest.mark.parametrize("why", ["switch", "version", "arity"])
def test_the_first_call_check_falls_back_with_a_reason(gpu_free, monkeypatch, why):
    prep, call = _decode_launch()
    fake = _FakeJIT(kernels.split_kv_kernel)
    if why == "switch":
        monkeypatch.setenv(fast_launch.ENV, "0")
    elif why == "version":
        monkeypatch.setattr(triton, "__version__", "9.0.0")
    else:
        fake.compiled.src.signature = dict(list(fake.compiled.src.signature.items())[:-1])
    fl = fast_launch.FastLaunch(fake, prep.grid, prep.stage1.positional, prep.stage1.tensor_slots, prep.constexprs)
    tensors = prep.tensors(*call)
    fl(*tensors)
    fl(*tensors)
    assert fl.fast is False and fl.reason
    assert {"switch": fast_launch.ENV, "version": "9.0.0", "arity": "launcher expects"}[why] in fl.reason
    assert len(fake.normal_launches) == 2 and not fake.compiled.calls


def test_bound_values_names_a_parameter_without_value():
    fake = _FakeJIT(kernels.merge_kernel)
    with pytest.raises(ValueError, match="HEAD_DIM"):
        fast_launch.bound_values(fake.params, (None,) * 22, {})
    assert np.all([p.name for p in fake.params][:2] == ["PART_O", "PART_LSE"])


def test_one_off_launches_take_the_normal_launch(gpu_free):
    prep, call = _decode_launch()
    fake = _FakeJIT(kernels.split_kv_kernel)
    fl = fast_launch.FastLaunch(fake, prep.grid, prep.stage1.positional, prep.stage1.tensor_slots, prep.constexprs,
                                enabled=False)
    tensors = prep.tensors(*call)
    fl(*tensors)
    fl(*tensors)
    assert fl.fast is False and "one-off" in fl.reason and len(fake.normal_launches) == 2
    assert prep.stage1.enabled and prep.merge.call.enabled  # prepared launches (the wrapper's) may be fast


# -- a new plan of other sizes: the compiled kernel another launch checked, from the first call ---------


def test_a_new_plan_of_other_sizes_launches_fast_from_its_first_call(gpu_free):
    prep_a, call_a = _decode_launch(lens=(50, 17))
    prep_b, call_b = _decode_launch(lens=(70, 9, 33, 120))   # more requests, rows, items and slots
    assert prep_a.constexprs == prep_b.constexprs and prep_a.grid != prep_b.grid
    fake = _FakeJIT(kernels.split_kv_kernel)
    st = prep_a.stage1
    a = fast_launch.FastLaunch(fake, prep_a.grid, st.positional, st.tensor_slots, prep_a.constexprs)
    a(*prep_a.tensors(*call_a))     # compiles (a normal launch) and checks
    assert a.fast and not a.reused and len(fake.normal_launches) == 1
    b = fast_launch.FastLaunch(fake, prep_b.grid, prep_b.stage1.positional, st.tensor_slots, prep_b.constexprs)
    tensors_b = prep_b.tensors(*call_b)
    b(*tensors_b)
    # no normal launch, no binder: straight to the launcher, with b's grid and values
    assert b.fast and b.reused and len(fake.normal_launches) == 1 and len(fake.compiled.calls) == 1
    got = fake.compiled.calls[0]
    assert got[:3] == (*prep_b.grid, 1)
    # what Triton would bind for b: the same values, and the same compiled kernel (the plan-size
    # integers are not specialized, so b's Triton cache key is a's)
    from triton import knobs
    from triton.runtime.jit import compute_cache_key
    kw = dict(prep_b.constexprs, debug=knobs.runtime.debug,
              instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound, spec, options = fake.binder(*b.arguments(tensors_b), **kw)
    assert fake.kernel_cache.get(compute_cache_key(fake.key_cache, spec, options)) is fake.compiled
    for i, (v, e) in enumerate(zip(got[9:], bound.values())):
        assert v == (e.data_ptr() if isinstance(e, torch.Tensor) else e), (i, fake.params[i].name)
    # the plan-size integers did differ between the two launches
    names = [p.name for p in fake.params]
    assert any(a.positional[names.index(n)] != b.positional[names.index(n)] for n in ("BATCH", "NUM_ROWS", "NUM_SLOTS"))


def test_a_launch_adopts_a_siblings_launcher_only_for_the_same_specialization(gpu_free):
    """``FastLaunch.adopt``: a launch of other plan sizes takes a checked sibling's launcher without
    any first-call check (its values are what Triton would bind); a launch that differs in a value
    Triton specializes on, in its keyword arguments, or a sibling not checked yet: no adoption."""
    prep_a, call_a = _decode_launch(lens=(50, 17))
    prep_b, call_b = _decode_launch(lens=(70, 9, 33, 120))
    fake = _FakeJIT(kernels.split_kv_kernel)
    st = prep_a.stage1

    def make(prep, positional=None, kwargs=None):
        return fast_launch.FastLaunch(fake, prep.grid, positional or prep.stage1.positional, st.tensor_slots,
                                      kwargs or prep.constexprs)

    a = make(prep_a)
    assert not make(prep_b).adopt(a)            # a has not been called: nothing checked to take
    a(*prep_a.tensors(*call_a))
    b = make(prep_b)
    assert b.adopt(a) and b.adopted and b.fast
    tensors_b = prep_b.tensors(*call_b)
    b(*tensors_b)
    assert len(fake.normal_launches) == 1 and len(fake.compiled.calls) == 1
    got = fake.compiled.calls[0]
    assert got[:3] == (*prep_b.grid, 1)
    from triton import knobs
    kw = dict(prep_b.constexprs, debug=knobs.runtime.debug,
              instrumentation_mode=knobs.compilation.instrumentation_mode)
    bound = fake.binder(*b.arguments(tensors_b), **kw)[0]
    for i, (v, e) in enumerate(zip(got[9:], bound.values())):
        assert v == (e.data_ptr() if isinstance(e, torch.Tensor) else e), (i, fake.params[i].name)
    names = [p.name for p in fake.params]
    pos = list(prep_b.stage1.positional)
    i = names.index("stride_bt")
    pos[i] = 33 if pos[i] % 16 == 0 else 32     # Triton would specialize this one apart
    assert not make(prep_b, positional=tuple(pos)).adopt(a)
    pos = list(prep_b.stage1.positional)
    pos[names.index("qk_scale")] = 0.25         # an exact value
    assert not make(prep_b, positional=tuple(pos)).adopt(a)
    assert not make(prep_b, kwargs=dict(prep_b.constexprs, num_stages=2)).adopt(a)
    assert not fast_launch.FastLaunch(fake, prep_b.grid, prep_b.stage1.positional, st.tensor_slots,
                                      prep_b.constexprs, enabled=False).adopt(a)


def test_another_specialization_takes_the_full_first_call_check(gpu_free):
    prep, call = _decode_launch()
    fake = _FakeJIT(kernels.split_kv_kernel)
    st = prep.stage1
    tensors = prep.tensors(*call)
    fast_launch.FastLaunch(fake, prep.grid, st.positional, st.tensor_slots, prep.constexprs)(*tensors)
    names = [p.name for p in fake.params]
    # a specialized integer (a stride) no longer a multiple of 16: another compiled kernel in Triton
    pos = list(st.positional)
    i = names.index("stride_bt")
    pos[i] = 33 if pos[i] % 16 == 0 else 32
    other = fast_launch.FastLaunch(fake, prep.grid, tuple(pos), st.tensor_slots, prep.constexprs)
    other(*tensors)
    assert other.fast and not other.reused and len(fake.normal_launches) == 2
    # a misaligned tensor on the first call: the full check too
    shifted = torch.empty(tensors[0].numel() + 1, dtype=tensors[0].dtype)[1:].view(tensors[0].shape)
    third = fast_launch.FastLaunch(fake, prep.grid, st.positional, st.tensor_slots, prep.constexprs)
    third(shifted, *tensors[1:])
    assert not third.reused and len(fake.normal_launches) == 3


@pytest.mark.parametrize("kernel", ["split_kv_kernel", "merge_kernel"])
def test_the_specialization_key_is_never_coarser_than_triton(gpu_free, kernel):
    """Each non-tensor argument varied over values that Triton specializes apart (1, multiples of 16,
    widths): wherever Triton's specialization differs, so does the key; the plan-size integers marked
    ``do_not_specialize`` change neither (plans of other sizes share the kernel)."""
    from triton import knobs
    fake = _FakeJIT(getattr(kernels, kernel))
    if kernel == "split_kv_kernel":
        prep, call = _decode_launch()
        st = prep.stage1
        args, slots, kw = list(st.arguments(prep.tensors(*call))), st.tensor_slots, prep.constexprs
    else:
        prep, call = _decode_launch()
        m = prep.merge.call
        q, k, v, bt, seq_lens, qsl, dp, out, lse, part_o, part_lse = call[:11]
        args = list(m.arguments((part_o, part_lse, out, lse, dp.view("row_slot_start"), dp.view("row_num_splits"),
                                 seq_lens, qsl)))
        slots, kw = m.tensor_slots, m.kwargs
    opts = dict(kw, debug=knobs.runtime.debug, instrumentation_mode=knobs.compilation.instrumentation_mode)
    dns = set(getattr(kernels, "STAGE1_DO_NOT_SPECIALIZE" if kernel == "split_kv_kernel" else
                      "MERGE_DO_NOT_SPECIALIZE"))

    def both(a):
        spec = fake.binder(*a, **opts)[1]
        return tuple(spec), fast_launch.specialization_key(fake, fast_launch.bound_values(fake.params, tuple(a), kw),
                                                          slots, kw)

    base_spec, base_key = both(args)
    assert base_key is not None
    seen_same = 0
    for i, p in enumerate(fake.params[:len(args)]):
        if i in slots or p.is_constexpr or type(args[i]) is not int:
            continue
        for value in (0, 1, 2, 16, 17, 48, 2 ** 31 - 16, 2 ** 31, 2 ** 40 + 1):
            a = list(args)
            a[i] = value
            spec, key = both(a)
            if spec != base_spec:
                assert key != base_key, (p.name, value)
            if p.name in dns:
                assert spec == base_spec or value >= 2 ** 31, (p.name, value)   # only the width may differ
                seen_same += spec == base_spec and key == base_key
    assert seen_same > 0 if dns else True


def test_the_wrapper_reuses_the_compiled_kernel_for_a_new_plan(gpu_free, monkeypatch):
    """``DecodeWrapper.run()`` after ``plan()`` of other sizes: a new prepared launch whose first call
    goes straight to the launcher (stage 1 and the merge), its launchers adopted from the previous
    launch (its tensors of the same dtypes)."""
    fakes = {name: _FakeJIT(getattr(kernels, name)) for name in ("split_kv_kernel", "merge_kernel")}
    for name, fake in fakes.items():
        monkeypatch.setattr(kernels, name, fake)
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device="cpu", policy="size:16")
    seen = []
    for lens in ([50, 17], [70, 9, 33, 120], [5, 200]):
        inp = cases.random_inputs(len(lens), lens, num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
        w.plan(inp.seq_lens)
        x = to_torch(inp, "cpu")
        x["block_table"] = _wide(x["block_table"])
        w.run(**x)
        st, mg = w.last_launch.stage1, w.last_launch.merge.call
        seen.append((st.fast, st.reused or st.adopted, mg.fast, mg.reused or mg.adopted, st.adopted and mg.adopted))
    assert seen[0] == (True, False, True, False, False)
    assert seen[1:] == [(True, True, True, True, True)] * 2
    assert len(fakes["split_kv_kernel"].normal_launches) == 1 and len(fakes["merge_kernel"].normal_launches) == 1
    assert len(fakes["split_kv_kernel"].compiled.calls) == 2


def test_a_batch_of_other_sizes_keeps_the_launcher_with_its_own_bounds(gpu_free, monkeypatch):
    """``DecodeWrapper.run()`` for batches of other sizes (one cache, one block-table width) keeps one
    prepared launch: the launcher gets each batch's grid and the request and row bounds Triton would
    bind for that call (``FastLaunch.set_values`` on plan-size integers), with no normal launch."""
    fakes = {name: _FakeJIT(getattr(kernels, name)) for name in ("split_kv_kernel", "merge_kernel")}
    for name, fake in fakes.items():
        monkeypatch.setattr(kernels, name, fake)
    inp = cases.random_inputs(3, [70, 9, 33, 120, 64], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=8)
    x = to_torch(inp, "cpu")
    x["block_table"] = _wide(x["block_table"])
    w = DecodeWrapper(4, 2, 32, 8, dtype="float32", device="cpu", policy="size:16")
    from triton import knobs
    names = [p.name for p in fakes["split_kv_kernel"].params]
    for k, B in enumerate((5, 2, 4, 3)):
        sub = dict(x, q=x["q"][:B], block_table=x["block_table"][:B], seq_lens=x["seq_lens"][:B],
                   query_start_loc=x["query_start_loc"][:B + 1])
        w.plan(inp.seq_lens[:B])
        w.run(**sub)
        prep = w.last_launch
        if k == 0:   # the first call: Triton's normal launch (it compiles), then the check
            first = prep
            continue
        assert prep is first and prep.stage1.fast and prep.merge.call.fast
        got = fakes["split_kv_kernel"].compiled.calls[-1]
        assert got[:3] == (w.dplan.num_items, w.dplan.row_blocks, 1)
        assert got[9 + names.index("BATCH")] == B and got[9 + names.index("NUM_ROWS")] == B
        # what Triton binds for this call: the launcher's values
        tensors = prep.tensors(sub["q"], sub["k_cache"], sub["v_cache"], sub["block_table"], sub["seq_lens"],
                               sub["query_start_loc"], w.dplan, w._buffers["out"], w._buffers["lse"],
                               w._buffers["part_o"], w._buffers["part_lse"], errors=w._buffers["errors"])
        kw = dict(prep.constexprs, debug=knobs.runtime.debug, instrumentation_mode=knobs.compilation.instrumentation_mode)
        bound = fakes["split_kv_kernel"].binder(*prep.stage1.arguments(tensors), **kw)[0]
        for i, (v, e) in enumerate(zip(got[9:], bound.values())):
            assert v == (e.data_ptr() if isinstance(e, torch.Tensor) else e), (B, names[i])
        assert fakes["merge_kernel"].compiled.calls[-1][:3] == (B, 4, 1)
    assert len(fakes["split_kv_kernel"].normal_launches) == 1 and len(fakes["merge_kernel"].normal_launches) == 1
    assert len(fakes["split_kv_kernel"].compiled.calls) == 3


def test_set_values_outside_the_plan_sizes_takes_the_first_call_check_again(gpu_free):
    prep, call = _decode_launch()
    fake = _FakeJIT(kernels.split_kv_kernel)
    st = prep.stage1
    tensors = prep.tensors(*call)
    a = fast_launch.FastLaunch(fake, prep.grid, st.positional, st.tensor_slots, prep.constexprs)
    a(*tensors)
    names = [p.name for p in fake.params]
    a.set_values({names.index("BATCH"): 7})           # a plan size: the launcher stays
    assert a.fast and a._values[names.index("BATCH")] == 7
    a(*tensors)
    assert len(fake.normal_launches) == 1 and fake.compiled.calls[-1][9 + names.index("BATCH")] == 7
    i = names.index("stride_bt")
    a.set_values({i: 33 if st.positional[i] % 16 == 0 else 32})   # specialized: Triton's check again
    assert a.fast is None
    a(*tensors)
    assert len(fake.normal_launches) == 2 and a.fast


# -- the launch by the CUDA driver (cuda_ref.driver_launch), with a fake driver ------------------------


class _FakeDriver:
    """``cuLaunchKernelEx`` stand-in: each call's configuration and its parameter block, read back from
    the addresses the block holds (as the driver reads them) by the types of the compiled signature."""

    def __init__(self, kinds, code=0):
        self.kinds, self.code, self.calls = kinds, code, []

    def __call__(self, config_ref, function, params, extra):
        import ctypes
        c = config_ref._obj
        import struct
        values = [struct.unpack(fmt, ctypes.string_at(params[j], struct.calcsize(fmt)))[0]
                  for j, fmt in enumerate(self.kinds)]
        attrs = [(c.attrs[i].id, c.attrs[i].value[0]) for i in range(c.numAttrs)]
        self.calls.append(dict(grid=(c.gridDimX, c.gridDimY, c.gridDimZ), block=c.blockDimX, shared=c.sharedMemBytes,
                               stream=c.hStream, function=function.value, values=values, attrs=attrs, extra=extra))
        return self.code


def _meta(constexprs, shared=4096):
    """A compiled kernel's metadata as Triton 3.6 / 3.7 write it (the fields a driver launch reads)."""
    from collections import namedtuple
    meta = namedtuple("Meta", "num_warps num_ctas shared global_scratch_size profile_scratch_size launch_pdl "
                              "launch_cooperative_grid")
    return meta(8, 1, shared, 0, 0, bool(constexprs.get("launch_pdl")), False)


def _compiled_signature(fake, fl, tensors, constexprs):
    """Give the fake compiled kernel the signature Triton's binder specializes for these arguments."""
    from triton import knobs
    kw = dict(constexprs, debug=False, instrumentation_mode=knobs.compilation.instrumentation_mode)
    _, spec, _ = fake.binder(*fl.arguments(tensors), **kw)
    types = [x[0] for x in spec]
    fake.compiled.src.signature = {p.name: t for p, t in zip(fake.params, types)}
    fake.compiled.metadata = _meta(constexprs)
    return types


def _driver_ready(monkeypatch, kernel, grid, positional, slots, constexprs, tensors, code=0):
    """A FastLaunch of ``kernel`` whose fake compiled kernel carries its real signature and metadata,
    its launches going to a fake driver (answering ``code``). Returns ``(fake JIT, launch, driver,
    Triton's bound values, the block's layout)`` after one normal call."""
    import struct

    from cuda_ref import driver_launch

    fake = _FakeJIT(kernel)
    fl = fast_launch.FastLaunch(fake, grid, positional, slots, constexprs)
    layout, why = driver_launch.block_layout(_compiled_signature(fake, fl, tensors, constexprs), slots)
    assert why is None
    kinds = [k for _, k in layout] + ["Q"] * driver_launch.SCRATCH_PARAMS
    drv = _FakeDriver(kinds, code)
    monkeypatch.setattr(driver_launch, "driver_functions", lambda: (drv, None))
    monkeypatch.setattr(driver_launch, "driver_param_sizes",
                        lambda f, n: [struct.calcsize(k) for k in kinds][:n])
    fl(*tensors)
    assert fl.fast is True and fl._driver is not None, fl.reason
    return fake, fl, drv, fake.normal_launches[0][1], layout


def _assert_block(drv_call, layout, expected, tensors, slots):
    """The block holds Triton's values: each tensor's address, each scalar as its C type, null scratch."""
    values = drv_call["values"]
    assert len(values) == len(layout) + 2 and values[-2:] == [0, 0]
    by_slot = dict(zip(slots, tensors))
    for (i, kind), v in zip(layout, values):
        e = expected[i]
        if i in by_slot:
            assert v == by_slot[i].data_ptr(), i
        elif kind == "f":
            assert v == pytest.approx(float(e), rel=1e-7), i
        else:
            assert v == (0 if e is None else int(e)), (i, v, e)


@pytest.mark.parametrize("variant", [dict(), dict(fuse=True), dict(soft_cap=30.0, window=5), dict(int8=True)])
def test_the_driver_launch_block_holds_what_triton_binds_for_stage1(gpu_free, monkeypatch, variant):
    prep, call = _decode_launch(**variant)
    tensors = prep.tensors(*call)
    s = prep.stage1
    fake, fl, drv, expected, layout = _driver_ready(monkeypatch, kernels.split_kv_kernel, prep.grid, s.positional,
                                                    s.tensor_slots, prep.constexprs, tensors)
    assert "CUDA driver" in fl.reason
    fl(*tensors)
    assert not fake.compiled.calls and len(drv.calls) == 1   # the driver, not Triton's launcher
    c = drv.calls[0]
    assert c["grid"] == (*prep.grid, 1) and c["block"] == 256 and c["shared"] == 4096 and c["stream"] == 77
    assert c["function"] == 0xF00 and c["extra"] is None
    assert c["attrs"] == ([(6, 1)] if prep.constexprs.get("launch_pdl") else [])
    _assert_block(c, layout, expected, tensors, s.tensor_slots)
    # fresh tensors, another grid, new plan sizes: the block follows
    fresh = tuple(t.clone() for t in tensors)
    fl.set_grid((prep.grid[0] + 3, prep.grid[1]))
    loose = fast_launch._param_groups(fake, s.tensor_slots)[1]
    i = loose[0]
    fl.set_values({i: expected[i] + 16})
    fl(*fresh)
    c = drv.calls[1]
    assert c["grid"] == (prep.grid[0] + 3, prep.grid[1], 1)
    expected = list(expected)
    expected[i] += 16
    _assert_block(c, layout, expected, fresh, s.tensor_slots)


def test_the_driver_launch_block_holds_what_triton_binds_for_the_merge(gpu_free, monkeypatch):
    prep, call = _decode_launch()
    m = prep.merge
    q, k, v, bt, seq_lens, qsl, dp, out, lse, part_o, part_lse = call[:11]
    tensors = (part_o, part_lse, out, lse, dp.view("row_slot_start"), dp.view("row_num_splits"), seq_lens, qsl)
    fake, fl, drv, expected, layout = _driver_ready(monkeypatch, kernels.merge_kernel, m.grid, m.call.positional,
                                                    m.call.tensor_slots, m.constexprs, tensors)
    fl(*tensors)
    c = drv.calls[0]
    assert c["attrs"] == [(6, 1)]   # the merge is launched by programmatic dependent launch
    _assert_block(c, layout, expected, tensors, m.call.tensor_slots)


def test_a_driver_that_refuses_hands_the_call_to_tritons_launcher(gpu_free, monkeypatch):
    prep, call = _decode_launch()
    tensors = prep.tensors(*call)
    s = prep.stage1
    fake, fl, drv, expected, _ = _driver_ready(monkeypatch, kernels.split_kv_kernel, prep.grid, s.positional,
                                               s.tensor_slots, prep.constexprs, tensors, code=201)
    fl(*tensors)
    assert len(drv.calls) == 1 and len(fake.compiled.calls) == 1   # tried, then Triton's launcher


def test_the_triton_switch_and_a_mismatched_driver_keep_tritons_launcher(gpu_free, monkeypatch):
    from cuda_ref import driver_launch
    prep, call = _decode_launch()
    tensors = prep.tensors(*call)
    s = prep.stage1
    monkeypatch.setattr(driver_launch, "driver_functions", lambda: (lambda *a: 0, None))
    for env, sizes, want in (("triton", None, "SPLITKV_FAST_LAUNCH=triton"), ("1", [8, 4], "parameter sizes"),
                             ("1", None, "reports fewer")):
        monkeypatch.setenv(fast_launch.ENV, env)
        monkeypatch.setattr(driver_launch, "driver_param_sizes", lambda f, n, sizes=sizes: sizes)
        fake = _FakeJIT(kernels.split_kv_kernel)
        fl = fast_launch.FastLaunch(fake, prep.grid, s.positional, s.tensor_slots, prep.constexprs)
        _compiled_signature(fake, fl, tensors, prep.constexprs)
        fl(*tensors)
        fl(*tensors)
        assert fl._driver is None and want in fl.reason and len(fake.compiled.calls) == 1


def test_block_layout_refuses_what_it_does_not_write():
    from cuda_ref import driver_launch
    layout, why = driver_launch.block_layout(["*bf16", "i32", "constexpr", "fp32", "i1"], (0,))
    assert why is None and layout == [(0, "Q"), (1, "i"), (3, "f"), (4, "b")]
    assert driver_launch.block_layout(["*bf16", "bf16"], (0,))[1] == "parameter 1: type bf16 is not written by the driver launch"
    assert "constexpr" in driver_launch.block_layout(["constexpr", "i32"], (0,))[1]
    assert "tensor slot of type i32" in driver_launch.block_layout(["*fp32", "i32"], (1,))[1]
