"""CSA's cost term (CSPS §3.2.4): shares of dense KV moved and attended, pure Python."""

import pytest

from infermax.costmodel.communication import (
    CsaFractions,
    csa_keep_ratios,
    csa_kv_fractions,
    csa_num_kept,
    csa_rings,
)


def test_rings_tile_the_earlier_keys_from_near_to_far():
    # CSPS Fig. 7: 4 segments of 2 tokens; the 4th segment (6..7) sees 4..5 at level 2, 0..3 at level 3
    assert csa_rings(6, 2, 3) == [(2, 4, 6), (3, 0, 4)]
    assert csa_rings(4, 2, 3) == [(3, 0, 4)]  # first of its level-2 pair: nothing at level 2
    assert csa_rings(0, 2, 3) == []
    assert csa_rings(6, 2, 1) == []
    for start in range(0, 96, 4):
        rings = csa_rings(start, 4, 5)
        assert [lv for lv, _, _ in rings] == sorted(lv for lv, _, _ in rings)
        ends = [start] + [lo for _, lo, _ in rings]
        assert [hi for _, _, hi in rings] == ends[:-1] and (not rings or rings[-1][1] == 0)


def test_no_dropping_at_two_levels_is_dense():
    assert csa_kv_fractions(4096, 512, 2, 0.0) == CsaFractions(moved=1.0, attended=1.0)
    assert csa_kv_fractions(4096, 512, 1, 0.7) == CsaFractions(moved=1.0, attended=1.0)  # one level drops nothing
    assert csa_kv_fractions(300, 512, 3, 0.7) == CsaFractions(moved=1.0, attended=1.0)  # one segment


def test_dropping_everything_keeps_only_the_own_segments():
    f = csa_kv_fractions(1024, 128, 3, 1.0)
    assert f.moved == 0.0
    own, causal = 8 * 128 * 129 // 2, 1024 * 1025 // 2
    assert f.attended == pytest.approx(own / causal)


def test_fractions_fall_as_the_drop_ratio_and_the_levels_grow():
    moved = [csa_kv_fractions(8192, 1024, 3, p).moved for p in (0.0, 0.25, 0.5, 0.75, 1.0)]
    attended = [csa_kv_fractions(8192, 1024, 3, p).attended for p in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert moved == sorted(moved, reverse=True) and attended == sorted(attended, reverse=True)
    by_levels = [csa_kv_fractions(8192, 1024, lv, 0.3).attended for lv in (2, 3, 4)]
    assert by_levels == sorted(by_levels, reverse=True)
    assert all(0.0 <= a <= 1.0 for a in moved + attended)


def test_closed_form_two_levels():
    """Two levels: every earlier key is level 2 and keeps round((1 - p) · a_s) of a_s keys."""
    n, seg, p = 64, 16, 0.25
    kept = sum(csa_num_kept(a, 1 - p) for a in range(0, n, seg))
    dense = sum(range(0, n, seg))
    f = csa_kv_fractions(n, seg, 2, p)
    assert f.moved == pytest.approx(kept / dense)
    own = 4 * seg * (seg + 1) // 2
    assert f.attended == pytest.approx((own + seg * kept) / (own + seg * dense))


def test_block_rounding_moves_at_least_the_tokens():
    tokens = csa_kv_fractions(10_000, 1000, 4, 0.6)
    blocks = csa_kv_fractions(10_000, 1000, 4, 0.6, block_tokens=64)
    assert blocks.moved >= tokens.moved and blocks.attended >= tokens.attended
    whole = csa_kv_fractions(10_000, 1000, 4, 0.6, block_tokens=10_000)  # one block per nonempty ring
    assert whole.moved == 1.0


def test_zero_drop_ratio_still_drops_beyond_level_two():
    """At p = 0 the halving rule keeps half the level-3 ring (the paper drops 22 % of tokens at a zero budget)."""
    f = csa_kv_fractions(1 << 20, 1 << 16, 3, 0.0)
    assert 0.5 < f.attended < 1.0 and 0.5 < f.moved < 1.0
    assert csa_keep_ratios(0.0, 3) == [1.0, 1.0, 0.5]


@pytest.mark.parametrize("kwargs,match", [
    ({"seq_len": 0}, "seq_len must be >= 1, got 0"),
    ({"segment_tokens": 0}, "segment_tokens must be >= 1, got 0"),
    ({"block_tokens": -1}, "block_tokens must be >= 1, got -1"),
    ({"drop_ratio": 1.2}, r"drop_ratio must be in \[0, 1\], got 1.2"),
    ({"num_levels": 0}, "num_levels must be >= 1, got 0"),
])
def test_bad_parameters_name_the_field_and_value(kwargs, match):
    args = {"seq_len": 1024, "segment_tokens": 128, "num_levels": 3, "drop_ratio": 0.5} | kwargs
    with pytest.raises(ValueError, match=match):
        csa_kv_fractions(**args)
