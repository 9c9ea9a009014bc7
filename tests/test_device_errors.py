"""The error record device kernels keep (splitkv_common/device_errors.py): merging per-block records
and the message check_errors() raises."""

from splitkv_common.device_errors import ERROR_SLOTS, describe_errors, merge_records


def test_merge_sums_counts_ors_bits_and_keeps_the_first_record_that_counted():
    clean = [0] * 16                                   # a slot of 16 words (64 bytes), 8 used
    page = [2, 5, 7, 999, 0, 0, 0, 0] + [0] * 8
    req = [0, 0, 0, 0, 2, 1, 3, 2] + [0] * 8
    both = [1, 6, 1, -1, 17, 2, 4, 16] + [0] * 8
    rec = merge_records([clean, page, req, both])
    assert rec == [3, 5, 7, 999, 2 | 17, 3, 3, 2]
    assert merge_records([clean, clean]) == [0] * ERROR_SLOTS


def test_the_message_names_each_rule_and_the_first_seen():
    msg = describe_errors([3, 5, 7, 999, 19, 3, 3, 2], num_pages=64, counted="K tile copies")
    assert "page ids outside [0, 64)" in msg and "in 3 K tile copies" in msg
    assert "request 5, logical page 7, page id 999" in msg
    assert "past its block-table row" in msg and "negative" in msg and "past what the graph's plan covers" in msg
    assert "First seen: request 3 (seq_lens negative)" in msg
    assert describe_errors([0] * ERROR_SLOTS, 64) is None
