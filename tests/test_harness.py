"""The parity harness and the accuracy rule: the rule has teeth, the harness reports what ran and what did not."""

import json
import pathlib

import numpy as np
import pytest

from splitkv_common.parity import accuracy, registry
from splitkv_common.parity.accuracy import check
from splitkv_common.parity.cases import catalog, get_case
from splitkv_common.parity.harness import ERROR, FAIL, PASS, UNSUPPORTED, ParityReport, run_case, run_parity
from splitkv_common.merge import merge_rows
from splitkv_common.reference import split_attention, split_partials
from splitkv_common.parity.registry import Backend, discover, get_backend


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    """Backends registered by a test vanish after it."""
    monkeypatch.setattr(registry, "_REGISTERED", {})


# --- wrong backends the rule must catch ---------------------------------------------------------


def _naive_average(inputs, plan):
    """Average the splits' outputs instead of weighting them (seed section 03); lse itself is right."""
    po, pl = split_partials(inputs, plan)
    _, lse = merge_rows(po, pl, plan.row_slot_start, plan.row_num_splits)
    out = np.zeros_like(inputs.q)
    for t, (s, n) in enumerate(zip(plan.row_slot_start, plan.row_num_splits)):
        sl = slice(s, s + n)
        nonempty = np.isfinite(pl[sl])[..., None]                       # [n, H, 1]
        cnt = np.maximum(nonempty.sum(0), 1)
        out[t] = np.where(nonempty, po[sl], 0).sum(0) / cnt
    return out, lse


def _with(fn):
    def run(inputs, plan):
        out, lse = split_attention(inputs, plan)
        return fn(out.copy(), lse.copy())
    return run


def _nan_out(out, lse):
    out.flat[0] = np.nan
    return out, lse


def _nan_lse(out, lse):
    lse.flat[-1] = np.nan
    return out, lse


def _plus_inf_empty(out, lse):  # the FlashAttention 2 sentinel is accepted on input, never as output
    return out, np.where(np.isneginf(lse), np.inf, lse)


def _wrong_empty_out(out, lse):
    out[np.isneginf(lse)] = 1.0
    return out, lse


def _base2_lse(out, lse):
    return out, lse / np.log(2)


def _noisy(out, lse):
    return out + 1e-3, lse


WRONG = {
    "naive-average": (_naive_average, ["seed/worked-example", "seed/wrong-average-counterexample"], "out error"),
    "nan-out": (_with(_nan_out), ["seed/worked-example", "basic/vector-v-float32"], "NaN"),
    "nan-lse": (_with(_nan_lse), ["seed/worked-example", "basic/vector-v-bfloat16"], "NaN"),
    "plus-inf-empty": (_with(_plus_inf_empty), ["empty/some-rows", "empty/all-rows"], "empty pattern"),
    "wrong-empty-out": (_with(_wrong_empty_out), ["empty/some-rows", "empty/all-rows"], "empty row's out"),
    "base2-lse": (_with(_base2_lse), ["seed/worked-example", "gqa/6-2"], "lse error"),
    "noisy-fp32": (_with(_noisy), ["seed/worked-example", "basic/vector-v-float32"], "out error"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_the_accuracy_rule_has_teeth(name):
    run, cases, reason = WRONG[name]
    backend = Backend(name, run)
    for case in cases:
        r = run_case(backend, get_case(case))
        assert r.status == FAIL, (case, r.message)
        assert reason in r.message, (case, r.message)
        assert r.accuracy is not None and not r.accuracy.passed


def test_naive_average_passes_only_where_no_row_is_split():
    """The same wrong backend passes a case planned without splits: the counterexample needs splits."""
    r = run_case(Backend("naive", _naive_average), get_case("policy/none"))
    assert r.status == PASS


def test_the_right_backend_passes_the_same_cases():
    for case in ("seed/worked-example", "seed/wrong-average-counterexample", "empty/some-rows", "gqa/6-2"):
        r = run_case(Backend("ok", split_attention), get_case(case))
        assert r.status == PASS, r.message
        assert r.accuracy.reason == "ok" and r.accuracy.out_max <= r.accuracy.out_tol


# --- the rule itself --------------------------------------------------------------------------


def _arrays(unit=1.0):
    """A reference whose largest |out| is ``unit``, row 1 empty; and ``bump``, 1 on the non-empty rows."""
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((3, 2, 4))
    ref[1] = 0
    ref *= unit / np.abs(ref).max()
    lse = rng.standard_normal((3, 2))
    lse[1] = -np.inf
    bump = np.isfinite(lse)[..., None] * np.ones_like(ref)
    return ref, lse, bump


def test_tolerance_is_the_smaller_of_the_fixed_bound_and_a_multiple_of_the_plain_error():
    ref, lse, bump = _arrays()
    dt = "bfloat16"
    plain = ref + 1e-3 * bump                                   # plain bf16 error 1e-3
    tol = min(accuracy.OUT_BOUND[dt], accuracy.PLAIN_MULTIPLE * 1e-3 + accuracy.OUT_FLOOR[dt])
    assert tol < accuracy.OUT_BOUND[dt]
    ok = check(ref + 0.9 * tol * bump, lse, ref, lse, plain, dt)
    assert ok.passed and ok.out_tol == pytest.approx(tol) and ok.plain_max == pytest.approx(1e-3)
    bad = check(ref + 1.5 * tol * bump, lse, ref, lse, plain, dt)  # under the fixed bound, over the multiple
    assert not bad.passed and "out error" in bad.reason
    # a sloppy plain computation does not loosen the fixed bound
    loose = check(ref + 1.2 * accuracy.OUT_BOUND[dt] * bump, lse, ref, lse, ref + bump, dt)
    assert loose.out_tol == accuracy.OUT_BOUND[dt] and not loose.passed


def test_errors_are_in_units_of_the_largest_output():
    ref, lse, bump = _arrays(unit=100.0)
    a = check(ref + 5e-4 * bump, lse, ref, lse, ref, "float32")  # 5e-4 absolute is 5e-6 of 100
    assert a.out_max == pytest.approx(5e-6)
    assert a.passed
    r1, l1, b1 = _arrays(unit=1.0)
    assert not check(r1 + 5e-4 * b1, l1, r1, l1, r1, "float32").passed  # the same error on outputs of size 1


def test_lse_is_checked_as_well_as_out():
    ref, lse, _ = _arrays()
    off = lse + np.where(np.isfinite(lse), 1e-2, 0)
    a = check(ref, off, ref, lse, ref, "float32")
    assert not a.passed and "lse error" in a.reason
    hole = lse.copy()
    hole[0, 0] = -np.inf                                       # a non-empty row reported empty
    assert "empty pattern" in check(ref, hole, ref, lse, ref, "float32").reason
    filled = np.where(np.isneginf(lse), 0.0, lse)              # an empty row reported non-empty
    assert "empty pattern" in check(ref, filled, ref, lse, ref, "float32").reason


def test_shape_mismatch_and_nan_never_pass():
    ref, lse, _ = _arrays()
    assert "out shape" in check(ref[:2], lse, ref, lse, ref, "float32").reason
    assert "lse shape" in check(ref, lse[:, :1], ref, lse, ref, "float32").reason
    nan = ref.copy()
    nan[1, 1, 1] = np.nan                                      # even inside an empty row
    a = check(nan, lse, ref, lse, ref, "float32")
    assert not a.passed and "NaN" in a.reason and np.isnan(a.out_max)
    assert a.as_dict()["passed"] is False


# --- registry ---------------------------------------------------------------------------------


def test_register_and_discover():
    b = registry.register(Backend("fake", split_attention, description="test double"))
    found = discover()
    assert found["fake"] is b and {"numpy", "torch"} <= set(found)
    assert get_backend("fake") is b
    with pytest.raises(ValueError, match="backend: unknown 'nope'"):
        get_backend("nope")


def test_broken_entry_point_is_listed_as_unavailable(monkeypatch):
    class EP:
        name, value = "broken", "nowhere.module:backend"

        def load(self):
            raise ImportError("no module named nowhere")

    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [EP()])
    found = discover()
    assert "broken" in found and "numpy" in found     # the shipped backends are still there
    why = found["broken"].unavailable()
    assert "failed to load" in why and "no module named nowhere" in why
    with pytest.raises(RuntimeError):
        found["broken"].run(None, None)


def test_builtin_backends_load_by_name_without_entry_points(monkeypatch):
    """A source tree that was not installed: the shipped backends come from their ``module:attr`` names,
    the same strings as their entry points in pyproject.toml."""
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [])
    found = discover()
    for name, spec in registry.BUILTIN_BACKENDS.items():
        assert found[name] is registry.load_backend(spec) and found[name].name == name
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    eps = project["entry-points"][registry.ENTRY_POINT_GROUP]
    assert {n: eps[n] for n in registry.BUILTIN_BACKENDS} == registry.BUILTIN_BACKENDS


def test_broken_builtin_backend_is_listed_as_unavailable(monkeypatch):
    monkeypatch.setattr(registry.metadata, "entry_points", lambda group: [])
    monkeypatch.setitem(registry.BUILTIN_BACKENDS, "torch", "nowhere.module:torch_backend")
    found = discover()
    assert "numpy" in found and "failed to load" in found["torch"].unavailable()


# --- the harness ------------------------------------------------------------------------------


def _boom(inputs, plan):
    raise RuntimeError("kernel exploded")


def test_unavailable_is_listed_with_its_reason_and_not_run():
    calls = []
    never = Backend("never", lambda i, p: calls.append(1), unavailable=lambda: "needs an accelerator we lack")
    report = run_parity([never, get_backend("numpy")], catalog(("small",), "seed"), progress=False)
    assert report.unavailable == {"never": "needs an accelerator we lack"}
    assert calls == [] and {r.backend for r in report.results} == {"numpy"}
    assert report.ok
    md = report.to_markdown()
    assert "| never | unavailable: needs an accelerator we lack |" in md


def test_only_unavailable_backends_is_not_ok():
    report = run_parity([Backend("never", _boom, unavailable=lambda: "no")], catalog(("small",), "seed"),
                        progress=False)
    assert report.results == [] and not report.ok


def test_an_erroring_backend_is_reported_as_error_and_makes_ok_false():
    cases = catalog(("small",), "seed")
    report = run_parity([Backend("boom", _boom), get_backend("numpy")], cases, progress=False)
    errs = [r for r in report.results if r.backend == "boom"]
    assert len(errs) == len(cases) and all(r.status == ERROR for r in errs)
    assert all("RuntimeError: kernel exploded" in r.message for r in errs)
    assert all(r.status == PASS for r in report.results if r.backend == "numpy")
    assert not report.ok
    assert report.counts()["boom"] == {PASS: 0, FAIL: 0, ERROR: len(cases), UNSUPPORTED: 0}


def test_unsupported_cases_are_reported_not_passed():
    picky = Backend("picky", split_attention,
                    unsupported=lambda inp: "bf16 only" if inp.dtype != "bfloat16" else None)
    report = run_parity([picky], catalog(("small",), "seed"), progress=False)
    status = {r.case: r.status for r in report.results}
    assert status == {"seed/worked-example": UNSUPPORTED, "seed/worked-example-bf16": PASS,
                      "seed/wrong-average-counterexample": UNSUPPORTED}
    assert all(r.message == "bf16 only" for r in report.results if r.status == UNSUPPORTED)
    assert report.ok
    assert report.counts()["picky"][UNSUPPORTED] == 2


def test_a_failing_backend_makes_ok_false():
    report = run_parity([Backend("naive", _naive_average)], [get_case("seed/worked-example")], progress=False)
    assert report.results[0].status == FAIL and not report.ok


def test_plans_are_made_for_the_backends_device():
    seen = {}

    def spy(inputs, plan):
        seen["plan"] = plan
        return split_attention(inputs, plan)

    r = run_case(Backend("npu-like", spy, device="910b2"), get_case("policy/auto"))
    assert r.status == PASS and "910b2" in seen["plan"].reason
    assert r.plan.startswith("auto: splits")


def test_report_writes_markdown_and_json(tmp_path):
    report = run_parity([get_backend("numpy"), Backend("boom", _boom),
                         Backend("never", _boom, unavailable=lambda: "not here")],
                        catalog(("small",), "seed"), progress=False)
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    report.write(str(md))
    report.write(str(js))
    text = md.read_text()
    assert text.startswith("# splitkv parity report")
    assert "| numpy | 3 | 0 | 0 | 0 |" in text and "| boom | 0 | 0 | 3 | 0 |" in text
    assert "seed/worked-example" in text and "kernel exploded" in text and "unavailable: not here" in text
    data = json.loads(js.read_text())
    assert data["ok"] is False and data["unavailable"] == {"never": "not here"}
    assert data["counts"]["numpy"]["pass"] == 3
    assert len(data["results"]) == 6
    r0 = next(r for r in data["results"] if r["backend"] == "numpy")
    assert r0["status"] == "pass" and r0["accuracy"]["passed"] is True and r0["accuracy"]["out_max"] >= 0
    assert next(r for r in data["results"] if r["backend"] == "boom")["status"] == "error"
    assert ParityReport().to_json() and not ParityReport().ok


# --- the shipped backends on the catalog -------------------------------------------------------


@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_shipped_backend_passes_the_small_catalog(name):
    if name == "torch":
        pytest.importorskip("torch")
    b = get_backend(name)
    assert b.unavailable() is None
    report = run_parity([b], catalog(("small",)), progress=False)
    bad = [(r.case, r.status, r.message) for r in report.results if r.status != PASS]
    assert not bad
    assert report.ok and len(report.results) == len(catalog(("small",)))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["numpy", "torch"])
def test_shipped_backend_passes_the_full_catalog(name):
    if name == "torch":
        pytest.importorskip("torch")
    report = run_parity([get_backend(name)], catalog(("small", "full")), progress=False)
    bad = [(r.case, r.status, r.message) for r in report.results if r.status != PASS]
    assert not bad and report.ok


def test_numpy_is_the_only_hard_dependency():
    """With torch and tqdm made unimportable, splitkv_common still plans, runs the NumPy backend and
    reports (no progress bar)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for m in ('torch', 'tqdm', 'triton'): sys.modules[m] = None\n"
        "from splitkv_common.parity.cases import catalog\n"
        "from splitkv_common.parity.backends import numpy_backend, torch_backend\n"
        "from splitkv_common.parity.harness import run_parity\n"
        "r = run_parity([numpy_backend, torch_backend], catalog(pattern='seed'), progress=True)\n"
        "assert r.ok, r.to_markdown()\n"
        "assert 'torch' in r.unavailable, r.unavailable\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr
