"""The critical-path cost model (ascend_ops/cost_model.py): its engine, its constants file and the
programs it times. ESTIMATES: these tests pin the model's semantics, not NPU figures."""

from __future__ import annotations

import json

import pytest

from ascend_ops import cost_model as cm

C = cm.load_constants()
VEC = cm.VecWork(ins=24, drains=19, v_to_s=0, repeats_per_token=80 / 256, item_ins=18, item_drains=10,
                 item_v_to_s=1, item_repeats=29)


def test_constants_file_cites_every_entry_and_names_its_probe():
    data = json.loads(cm.DEFAULT_CONSTANTS.read_text())
    assert data["schema"] == "splitkv-npu-constants/1"
    for name, e in data["constants"].items():
        assert e["value"] > 0 and e["unit"] and e["source"], name
        assert "probe" in e, name
    # the latencies a node must calibrate each name a probe
    for name in ("hbm_tbps", "launch_us", "mix_launch_us", "dma_latency_us", "gm_roundtrip_us", "cross_flag_us",
                 "syncall_us", "core_mte2_gbps"):
        assert data["constants"][name]["probe"], name


def test_a_node_file_overrides_only_what_it_measured(tmp_path):
    f = tmp_path / "node.json"
    f.write_text(json.dumps({"schema": "splitkv-npu-constants/1", "device": "910b2",
                             "constants": {"cross_flag_us": {"value": 0.9, "unit": "us", "probe": "x",
                                                             "source": "measured"}}}))
    c = cm.load_constants(f)
    assert c.cross_flag_us == 0.9 and c.hbm_tbps == C.hbm_tbps and c.origin == str(f)
    f.write_text(json.dumps({"schema": "splitkv-npu-constants/1", "constants": {"warp_speed": {"value": 1}}}))
    with pytest.raises(ValueError, match="unknown constants.*warp_speed"):
        cm.load_constants(f)
    f.write_text(json.dumps({"schema": "other", "constants": {}}))
    with pytest.raises(ValueError, match="schema"):
        cm.load_constants(f)


@pytest.mark.parametrize("content, match", [
    (None, "cannot be read"), ("{", "cannot be read"), ("[]", "schema"),
    ({"schema": "splitkv-npu-constants/1"}, "'constants' must be"),
    ({"schema": "splitkv-npu-constants/1", "constants": {"hbm_tbps": 3}}, "hbm_tbps: value must be"),
    ({"schema": "splitkv-npu-constants/1", "constants": {"hbm_tbps": {"value": 0}}}, "hbm_tbps: value must be"),
    ({"schema": "splitkv-npu-constants/1", "constants": {"hbm_tbps": {"value": "fast"}}}, "hbm_tbps: value must be"),
    ({"schema": "splitkv-npu-constants/1", "constants": {"hbm_tbps": {"value": float("nan")}}}, "value must be"),
    ({"schema": "splitkv-npu-constants/1", "constants": {"launch_us": {"value": True}}}, "launch_us: value must be"),
])
def test_a_bad_constants_file_is_refused_naming_what_is_wrong(tmp_path, content, match):
    f = tmp_path / "node.json"
    if content is not None:
        f.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ValueError, match=match):
        cm.load_constants(f)


def test_pipes_overlap_unless_synchronised():
    core = cm.Core("x", ("A", "B"))
    assert core.op("A", 2.0) == 2.0
    assert core.op("B", 1.0) == 1.0          # another pipe: runs beside A
    assert core.op("A", 1.0) == 3.0          # the same pipe: in order
    core.sync("A", "B")
    assert core.op("B", 1.0) == 4.0          # waits for A's issued ops
    core.block(10.0)
    assert core.op("A", 1.0) == 11.0         # the scalar unit stalled: nothing issues before 10


def test_dma_latency_overlaps_a_busy_queue_but_not_an_idle_one():
    core = cm.Core("x", ("MTE2",))
    first = core.op("MTE2", 1.0, latency=0.5)       # idle pipe: the whole latency
    assert first == pytest.approx(1.5)
    second = core.op("MTE2", 1.0, latency=0.5)      # issued at 0, streams after the first
    assert second == pytest.approx(2.5)
    core.block(10.0)
    assert core.op("MTE2", 1.0, latency=0.5) == pytest.approx(11.5)  # a dependent copy pays it again


def test_cross_core_flags_carry_time_and_a_missing_set_is_a_deadlock():
    seen = {}

    def producer():
        yield ("set", "F", 3.0)
        yield ("set", "F", 5.0)

    def consumer():
        seen["a"] = yield ("wait", "F")
        seen["b"] = yield ("wait", "F")

    cm.run_programs({"c": consumer(), "p": producer()})
    assert seen == {"a": 3.0, "b": 5.0}

    def starved():
        yield ("wait", "G")

    with pytest.raises(RuntimeError, match="deadlock: s waits for G"):
        cm.run_programs({"s": starved()})


def _work(items, rows=4):
    return cm.CoreWork(tuple(items), rows, 128, 2, 24)


def test_a_pipeline_hides_the_exchange_latency_the_serial_kernel_pays():
    pipe = cm.Pipeline("p", 2048, 256, 2, True, True, True, 4)
    serial = cm.core_time_us(_work([8192]), cm.SERIAL_256, VEC, C)
    piped = cm.core_time_us(_work([8192]), pipe, VEC, C)
    stream = 8192 * 128 * 2 * 2 / (min(C.core_mte2_gbps, C.hbm_tbps * 1e3 / 24) * 1e3)  # K + V at the core's share
    assert piped < serial
    assert piped >= stream                      # no faster than the bytes
    assert serial > 1.5 * stream                # the serial chain: latency per 256-token tile
    assert piped < 1.15 * stream
    # the serial kernel gets slower with every latency; the pipelined one barely
    slow = C.with_values(gm_roundtrip_us=2 * C.gm_roundtrip_us, cross_flag_us=2 * C.cross_flag_us)
    assert cm.core_time_us(_work([8192]), cm.SERIAL_256, VEC, slow) - serial > \
        5 * (cm.core_time_us(_work([8192]), pipe, VEC, slow) - piped)


def test_preload_and_crossing_items_matter_for_many_short_items():
    items = [512] * 12
    base = cm.Pipeline("p", 2048, 256, 2, True, True, False, 4)
    across = cm.Pipeline("p", 2048, 256, 2, True, True, True, 4)
    no_pre = cm.Pipeline("p", 2048, 256, 1, False, True, False, 4)
    t_base, t_across, t_none = (cm.core_time_us(_work(items), p, VEC, C) for p in (base, across, no_pre))
    assert t_across < t_base < t_none


def test_items_are_dealt_in_contiguous_ranges_of_equal_length():
    per = cm.items_per_core(64, 2048, 8, 1, 24)
    assert sum(len(x) for x in per) == 512
    assert max(len(x) for x in per) - min(len(x) for x in per) <= 1
    per = cm.items_per_core(1, 16384, 8, 3, 24)
    assert [len(x) for x in per] == [1] * 24 and sum(map(sum, per)) == 8 * 16384


def test_launch_adds_launch_and_combine_only_with_splits():
    one = cm.launch_us(64, 2048, 32, 8, 128, 2, 1, cm.SERIAL_256, VEC, C)
    assert one["combine_us"] == 0 and one["us"] == pytest.approx(C.mix_launch_us + one["split_us"])
    three = cm.launch_us(1, 16384, 32, 8, 128, 2, 3, cm.SERIAL_256, VEC, C)
    assert three["combine_us"] >= C.syncall_us


def test_the_combine_charges_latencies_per_unit_of_row_and_kv_head():
    """Units are (query row, KV head); the first unit's splits are read before SyncAll (two latencies
    after it), each further unit pays three (its splits, its loads, the copy-out it waits for)."""
    one = cm.combine_us(1, 32, 128, 3, 48, C, num_kv_heads=8)     # 8 units on 48 vector cores: one each
    three = cm.combine_us(16, 32, 128, 3, 48, C, num_kv_heads=8)  # 128 units: three on the busiest core
    assert one == pytest.approx(C.syncall_us + 2 * C.dma_latency_us, abs=0.2)
    assert 6 * C.dma_latency_us < three - one < 6 * C.dma_latency_us + 0.5  # plus two units' bytes and vector work
    assert cm.combine_us(16, 32, 128, 1, 48, C, num_kv_heads=8) == 0.0


def test_hbm_floor():
    assert cm.hbm_floor_us(1, 16384, 8, 128, 2, C) == pytest.approx(16384 * 8 * 128 * 4 / (C.hbm_tbps * 1e6))


@pytest.mark.parametrize("batch,context,hkv", [(1, 16384, 8), (1, 65536, 4), (16, 8192, 8), (64, 2048, 4)])
def test_no_program_beats_the_lower_bound(batch, context, hkv):
    """The bound is the floor plus the least fixed cost any design pays: every timed program is at or
    above it, with or without splits."""
    bound = cm.lower_bound_us(batch, context, hkv, 128, 2, C)
    assert bound["us"] > C.mix_launch_us + cm.hbm_floor_us(batch, context, hkv, 128, 2, C)
    pipelined = cm.Pipeline("p", 2048, 256, 2, True, True, True, 4)
    for splits in (1, 3, 6):
        for p in (cm.SERIAL_256, pipelined):
            assert cm.launch_us(batch, context, 32, hkv, 128, 2, splits, p, VEC, C)["us"] >= bound["us"], (p.name, splits)


def test_the_bound_shows_where_1_3x_is_out_of_reach():
    """B1 16k with Hkv 4 (21 µs of K and V): a launch plus the least combine is already more than
    0.3x of it under the paper constants, so no kernel meets 1.3x there (docs/ascend-kernel.md)."""
    floor = cm.hbm_floor_us(1, 16384, 4, 128, 2, C)
    assert cm.lower_bound_us(1, 16384, 4, 128, 2, C)["us"] > 1.3 * floor
    assert cm.lower_bound_us(1, 16384, 8, 128, 2, C)["us"] < 1.3 * cm.hbm_floor_us(1, 16384, 8, 128, 2, C)
    # a node's smaller launch makes it reachable: the bound follows the constants
    fast = C.with_values(mix_launch_us=2.0)
    assert cm.lower_bound_us(1, 16384, 4, 128, 2, fast)["us"] < 1.3 * floor


@pytest.mark.parametrize("batch,context,hkv,template,splits,step", [
    (1, 16384, 8, "serial", 6, 8192), (1, 65536, 8, "preload", 3, 8192), (16, 8192, 8, "preload", 1, 8192),
    (64, 2048, 8, "preload", 1, 8192), (1, 16384, 4, "serial", 12, 4096), (1, 65536, 4, "serial", 12, 4096),
    (16, 8192, 4, "preload", 1, 4096), (64, 2048, 4, "preload", 1, 4096)])
def test_ifa_structure_follows_its_tiling_rules(batch, context, hkv, template, splits, step):
    """The template, split count and step IFA's tiling picks for the grid (worked by hand from
    incre_flash_attention_tiling*.cpp; see ifa_program's docstring)."""
    from splitkv_bench import npu_estimate as est
    from splitkv_common.devices import get_profile

    p, sp, cores = est.ifa_program(est.Shape("x", batch, context, 32, hkv=hkv), get_profile("910b2"))
    assert template in p.name and sp == splits and p.step_tokens == step
    assert (p.preload, cores) == ((4, 24) if template == "preload" else (1, 48))
