import json
import re

import numpy as np
import pytest

from infermax import Batch, Limits, Request, Schedule, Workload


def test_request_validates_each_field():
    with pytest.raises(ValueError, match="input_len"):
        Request(id=0, input_len=0, output_len=3)
    with pytest.raises(ValueError, match="output_len.*-2"):
        Request(id=0, input_len=3, output_len=-2)
    with pytest.raises(ValueError, match="arrival_s"):
        Request(id=0, input_len=3, output_len=2, arrival_s=float("nan"))
    with pytest.raises(ValueError, match="id"):
        Request(id=-1, input_len=3, output_len=2)
    with pytest.raises(ValueError, match="ttft_slo_s"):
        Request(id=1, input_len=3, output_len=2, ttft_slo_s=0.0)


def test_workload_rejects_duplicates_and_empty():
    with pytest.raises(ValueError, match="duplicate id: 3"):
        Workload(requests=(Request(id=3, input_len=1, output_len=1), Request(id=3, input_len=2, output_len=1)))
    with pytest.raises(ValueError, match="empty"):
        Workload(requests=())


def test_request_that_cannot_fit_names_request_and_M():
    w = Workload.from_lengths([10, 600], [5, 500])
    with pytest.raises(ValueError, match=r"request 1 cannot fit in M: .* = 1099 > M = 1000"):
        w.check_fits(Limits(M=1000))


def test_limits_spec_and_validation():
    lim = Limits.from_spec("M=100K,C=4096,P=512,R_max=128")
    assert (lim.M, lim.C, lim.P, lim.R_max) == (100_000, 4096, 512, 128)
    assert Limits.from_spec("C=2048").P == 2048
    assert Limits.from_spec("").M == 100_000
    with pytest.raises(ValueError, match="Limits.P must be <= C"):
        Limits(C=100, P=200)
    with pytest.raises(ValueError, match="unknown key 'Q'"):
        Limits.from_spec("Q=3")
    with pytest.raises(ValueError, match="Limits.M must be an integer, got 'lots'"):
        Limits.from_spec("M=lots")
    with pytest.raises(ValueError, match="Limits.M must be >= 1"):
        Limits(M=0)


def test_schedule_json_round_trip_is_lossless(tmp_path):
    s = Schedule((Batch(ids=[0, 2], tokens=[5, 1]), Batch(ids=[1], tokens=[3], evict=[0], not_before_s=0.125)),
                 meta={"scheduler": {"name": "hand"}, "note": "x"})
    again = Schedule.from_json(s.to_json())
    assert again == s
    s.to_json(tmp_path / "s.json")
    assert Schedule.from_json(tmp_path / "s.json") == s
    assert again.batches[1].evict.dtype == np.int64


def test_schedule_rejects_unknown_format():
    with pytest.raises(ValueError, match="Schedule.format"):
        Schedule.from_dict({"format": "other/1", "batches": []})


def test_batch_rejects_mismatched_and_fractional():
    with pytest.raises(ValueError, match="differ in length"):
        Batch(ids=[0, 1], tokens=[1])
    with pytest.raises(ValueError, match="Batch.tokens must hold integers"):
        Batch(ids=[0], tokens=[1.5])


def test_workload_dict_round_trip():
    w = Workload(requests=(Request(id=7, input_len=3, output_len=2, arrival_s=1.5, tag="x"),), name="w")
    assert Workload.from_dict(json.loads(json.dumps(w.to_dict()))).requests == w.requests


@pytest.mark.parametrize("batch,match", [
    ({"ids": [0], "tokens": [8.5]}, r"batches\[0\].tokens\[0\] must be an integer, got 8.5"),
    ({"ids": [0], "tokens": ["8"]}, r'batches\[0\].tokens\[0\] must be an integer, got "8"'),
    ({"ids": [True], "tokens": [8]}, r"batches\[0\].ids\[0\] must be an integer, got true"),
    ({"ids": [0], "tokens": [2**31]}, r"batches\[0\].tokens\[0\] = 2147483648 is out of range"),
    ({"ids": [0], "tokens": [8], "not_before_s": float("nan")}, r"batches\[0\].not_before_s must be a finite"),
    ({"ids": [0]}, r"batches\[0\].tokens is missing"),
    ({"ids": [0], "tokens": [8], "evcit": [1]}, r"unknown field\(s\) 'evcit'"),
])
def test_schedule_json_values_are_typed_strictly(batch, match):
    with pytest.raises(ValueError, match=match):
        Schedule.from_dict({"format": "infermax.schedule/1", "batches": [batch]})


def test_schedule_file_errors_name_the_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        Schedule.from_json(tmp_path / "none.json")
    with pytest.raises(ValueError, match="is a directory"):
        Schedule.from_json(tmp_path)
    bad = tmp_path / "s.json"
    bad.write_text('{"format": "infermax.schedule/1",\n "batches": [],\n "batches": []}')
    with pytest.raises(ValueError, match=f"{bad}.*duplicate key 'batches'"):
        Schedule.from_json(bad)
    bad.write_bytes(b"\xef\xbb\xbf" + Schedule(()).to_json().encode())      # a UTF-8 BOM is fine
    assert len(Schedule.from_json(bad)) == 0


@pytest.mark.parametrize("raw,message", [
    ("8.5", "must be an integer, got '8.5'"), ("true", "must be an integer, got 'true'"),
    ("inf", "must be an integer, got 'inf'"), ("1e30", "must be <= 2^53"), ("0", "must be a positive integer"),
])
def test_parse_count_refuses_what_is_not_a_count(raw, message):
    with pytest.raises(ValueError, match=re.escape(f"Limits.M {message}")):
        Limits.from_spec(f"M={raw}")
    assert Limits.from_spec("M=1e12,C=100K").M == 10**12
