import numpy as np
import pytest

from infermax import Workload
from infermax.workloads import arrivals, load_trace

TRACES = __import__("pathlib").Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vidur" / "traces"


def test_fixed_grid():
    w = Workload.from_spec("fixed:I=64,O=32,B=1024")
    assert len(w) == 1024 and set(w.input_lens) == {64} and set(w.output_lens) == {32}
    assert w.is_offline


def test_mix_is_seeded_and_uses_paper_sets():
    a = Workload.from_spec("mix:LILO+SISO,B=512,seed=1")
    b = Workload.from_spec("mix:LILO+SISO,B=512,seed=1")
    c = Workload.from_spec("mix:LILO+SISO,B=512,seed=2")
    assert a.requests == b.requests and a.requests != c.requests
    assert set(a.input_lens) <= {8, 16, 512, 1024}
    tags = [r.tag for r in a]
    assert tags.count("LILO") == tags.count("SISO") == 256
    for r in a:
        if r.tag == "SISO":
            assert r.input_len in (8, 16) and r.output_len in (8, 16)
        else:
            assert r.input_len in (512, 1024) and r.output_len in (512, 1024)


def test_poisson_and_gamma_arrivals():
    t = arrivals(20000, rate_per_s=10.0, seed=3)
    gaps = np.diff(t)
    assert abs(gaps.mean() - 0.1) < 0.005 and abs(gaps.std() / gaps.mean() - 1.0) < 0.05
    g = np.diff(arrivals(20000, rate_per_s=10.0, cv=3.0, seed=3))
    assert abs(g.std() / g.mean() - 3.0) < 0.3
    w = Workload.from_spec("fixed:I=8,O=8,B=50,rate=5,seed=1")
    assert not w.is_offline and np.all(np.diff(w.arrivals_s) >= 0)


def test_builtin_and_file_traces_agree():
    w = Workload.from_spec("trace:splitwise_conv,n=100")
    assert len(w) == 100 and w.requests[0].input_len == 374 and w.requests[0].output_len == 44
    if TRACES.exists():
        assert load_trace(str(TRACES / "splitwise_conv.csv"), n=100).requests == w.requests
    off = Workload.from_spec("trace:splitwise_code,n=10,offline=1")
    assert off.is_offline


def test_azure_trace_format(tmp_path):
    p = tmp_path / "azure.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n")
    w = Workload.from_spec(f"trace:{p}")
    assert [r.input_len for r in w] == [374, 396]
    assert w.arrivals_s[1] == pytest.approx(4.314579, abs=1e-6)


@pytest.mark.parametrize("body,match", [
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,12,x\n", r"line 2: malformed row"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,12,3\n1.0,0,3\n",
     r"line 3: num_prefill_tokens must be >= 1, got 0"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,12\n", r"line 2: malformed row"),
    ("time,a,b\n0,1,1\n", r"header .* matches neither"),
    ("arrived_at,num_prefill_tokens,num_decode_tokens\n", r"no request rows"),
])
def test_malformed_traces_name_line_and_field(tmp_path, body, match):
    p = tmp_path / "t.csv"
    p.write_text(body)
    with pytest.raises(ValueError, match=match):
        Workload.from_spec(f"trace:{p}")


@pytest.mark.parametrize("spec,match", [
    ("fixed:I=64,O=32", "B .* is required"),
    ("fixed:I=-4,O=32,B=3", "I must be a positive integer"),
    ("mix:XXXX,B=8", "unknown group 'XXXX'"),
    ("poisson:B=3", "unknown kind"),
    ("fixed:I=4,O=4,B=4,color=red", "unknown option"),
    ("trace:/no/such.csv", "does not exist"),
    ("fixed:I=4,O=4,B=4,rate=-1", "rate must be > 0"),
])
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        Workload.from_spec(spec)
