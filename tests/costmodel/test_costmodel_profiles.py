from pathlib import Path

import numpy as np
import pytest

from infermax.costmodel.profiles import (
    MissingProfileError,
    ProfileFormatError,
    available_profiles,
    load_attention_profile,
    load_mlp_profile,
    load_network_profile,
)

ATTENTION_HEADER = ("batch_size,prefill_chunk_size,kv_cache_size,is_prefill,num_tensor_parallel_workers,"
                    "time_stats.attn_prefill.median,time_stats.attn_decode.median")


def test_packaged_profiles_are_listed():
    assert {"a100/Llama-2-7b-hf", "a100/Meta-Llama-3-8B", "h100/Llama-2-7b-hf"} <= set(available_profiles())


def test_mlp_profile_a100_llama2_7b():
    p = load_mlp_profile("a100/llama2-7b")           # loose name → packaged Vidur directory
    assert p.tp == 1 and np.all(np.diff(p.num_tokens) > 0)   # sorted, duplicates averaged
    assert p.num_tokens[0] == 1 and p.num_tokens[-1] >= 4000 and len(p.num_tokens) == 259
    assert {"emb", "mlp_up_proj", "attn_pre_proj", "add"} <= set(p.op_times_s)
    total = p.total_s(32)
    assert 8e-3 < total[0] < 11e-3 and 0.2 < total[-1] < 0.3   # ~9.3 ms at 1 token, ~260 ms at 4096


def test_mlp_profile_tp_filter():
    tp1, tp4 = load_mlp_profile("a100/Llama-2-7b-hf", tp=1), load_mlp_profile("a100/Llama-2-7b-hf", tp=4)
    assert tp4.total_s(32)[-1] < tp1.total_s(32)[-1] / 2
    with pytest.raises(ProfileFormatError, match="num_tensor_parallel_workers == 3"):
        load_mlp_profile("a100/Llama-2-7b-hf", tp=3)


def test_attention_profile_split_dedup_and_clumps():
    a = load_attention_profile("a100/Llama-2-7b-hf")
    assert len(a.decode_batch) == 697 and len(a.prefill_chunk) == 314    # 5 duplicated prefill configs averaged
    assert np.unique(a.decode_group).size == 8 and np.unique(a.prefill_group).size == 4
    assert np.all(a.decode_time_s > 0) and np.all(a.prefill_time_s > 0)
    keys = set(zip(a.prefill_chunk.tolist(), a.prefill_kv.tolist()))
    assert len(keys) == len(a.prefill_chunk)


def test_attention_profile_llama3_zeros_for_other_phase():
    a = load_attention_profile("a100/Meta-Llama-3-8B", tp=4)   # GQA, FlashInfer, TP 1 and 4 present
    assert a.tp == 4 and len(a.decode_batch) > 1000 and np.all(a.decode_time_s > 0)


def test_network_profile():
    n = load_network_profile("a100", "all_reduce")
    assert (8, 8) in n.configurations() and (2, 1) in n.configurations()
    size, t = n.select(8, 8)
    assert np.all(np.diff(t[np.argsort(size)][::100]) >= 0)     # bigger messages take longer (coarsely)
    with pytest.raises(ValueError, match="collective"):
        load_network_profile("a100", "broadcast")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_missing_file_and_profile(tmp_path):
    with pytest.raises(MissingProfileError, match="has no mlp.csv"):
        load_mlp_profile(tmp_path)
    with pytest.raises(MissingProfileError, match="no packaged profile"):
        load_mlp_profile("h100/llama3-8b")


def test_empty_and_header_only(tmp_path):
    with pytest.raises(ProfileFormatError, match="header row and at least one data row"):
        load_mlp_profile(_write(tmp_path, "mlp.csv", ""))
    with pytest.raises(ProfileFormatError, match="header row and at least one data row"):
        load_mlp_profile(_write(tmp_path, "mlp.csv", "num_tokens,num_tensor_parallel_workers\n"))


def test_missing_columns_are_named(tmp_path):
    path = _write(tmp_path, "mlp.csv", "time_stats.add.median,num_tokens\n0.1,4\n")
    with pytest.raises(ProfileFormatError, match="missing column.*num_tensor_parallel_workers"):
        load_mlp_profile(path)
    with pytest.raises(ProfileFormatError, match=r"no time_stats.<op>.median"):
        load_mlp_profile(_write(tmp_path, "mlp2.csv", "num_tokens,num_tensor_parallel_workers\n4,1\n"))


def test_bad_cells_name_column_and_row(tmp_path):
    header = "time_stats.add.median,num_tokens,num_tensor_parallel_workers\n"
    with pytest.raises(ProfileFormatError, match=r"'time_stats.add.median', data row 2: not a number: 'fast'"):
        load_mlp_profile(_write(tmp_path, "a.csv", header + "0.1,4,1\nfast,8,1\n"))
    with pytest.raises(ProfileFormatError, match=r"'num_tokens', data row 1: not an integer"):
        load_mlp_profile(_write(tmp_path, "b.csv", header + "0.1,4.5,1\n"))
    with pytest.raises(ProfileFormatError, match="must be finite and >= 0"):
        load_mlp_profile(_write(tmp_path, "c.csv", header + "-0.1,4,1\n"))
    with pytest.raises(ProfileFormatError, match="data row 1 has 2 fields"):
        load_mlp_profile(_write(tmp_path, "d.csv", header + "0.1,4\n"))
    with pytest.raises(ProfileFormatError, match="num_tokens must be >= 1"):
        load_mlp_profile(_write(tmp_path, "e.csv", header + "0.1,0,1\n"))


def test_attention_rows_need_their_phase_time(tmp_path):
    good = ATTENTION_HEADER + "\n1,0,32,False,1,,0.01\n1,64,0,True,1,0.02,\n"
    a = load_attention_profile(_write(tmp_path, "attention.csv", good))
    assert a.decode_time_s.tolist() == [pytest.approx(1e-5)] and a.prefill_time_s.tolist() == [pytest.approx(2e-5)]
    with pytest.raises(ProfileFormatError, match="data row 1: empty attention time"):
        load_attention_profile(_write(tmp_path, "x.csv", ATTENTION_HEADER + "\n1,0,32,False,1,0.02,\n"))
    with pytest.raises(ProfileFormatError, match="'is_prefill', data row 1: not a boolean"):
        load_attention_profile(_write(tmp_path, "y.csv", ATTENTION_HEADER + "\n1,0,32,maybe,1,,0.01\n"))
    with pytest.raises(ProfileFormatError, match="missing column"):
        load_attention_profile(_write(tmp_path, "z.csv", "batch_size,kv_cache_size\n1,2\n"))
    with pytest.raises(ValueError, match="stat must be one of"):
        load_attention_profile(tmp_path / "attention.csv", stat="p99")


def test_columns_selected_by_name_not_position(tmp_path):
    a = "time_stats.add.median,num_tokens,num_tensor_parallel_workers\n0.5,4,1\n"
    b = "num_tensor_parallel_workers,num_tokens,time_stats.add.median\n1,4,0.5\n"
    pa, pb = load_mlp_profile(_write(tmp_path, "a.csv", a)), load_mlp_profile(_write(tmp_path, "b.csv", b))
    assert pa.op_times_s["add"] == pytest.approx(pb.op_times_s["add"])
