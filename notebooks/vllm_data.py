"""Notebook 12's data: vLLM's recorded runs, as small tables committed under ``data/vllm/``.

Recording needs the ``vllm`` extra and minutes of CPU (:func:`record`: the catalogue of
``benchmarks/vllm_fidelity.py --record`` and the plan comparisons of ``benchmarks/vllm_plans.py``); what the
notebook reads are the tables :func:`build` derives from those run directories (no vLLM needed):

- ``catalogue.csv``: per case, steps, preemptions, the judge's verdict and the steps the ``vllm-v1`` and
  ``sarathi-pc`` presets make identically (lockstep arrivals);
- ``timing.csv``: per case, mean TTFT and e2e predicted from vLLM's schedule (the model fitted to the other
  cases' CPU step times, absolute loss) beside the measured ones, CPU clock;
- ``gaps.csv``: certified gaps of vLLM's schedules and of the bound-guided ones under the fit of every case;
- ``plan_runs.csv`` and ``plan_ratios.csv``: the plans executed on vLLM, per run and per compared pair;
- ``cost_cpu_fit.json``: the model fitted to every case's CPU step times (the plans' predictions use it).

:func:`results` turns them into the one table the claims (``claims_vllm.py``) are measured on.
"""
from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DATA = HERE / "data" / "vllm"
BENCH = ROOT / "benchmarks"
RECORDED = ROOT / "tests" / "data" / "vllm"       # three catalogue runs kept whole (schedules and step times)
TABLES = ("catalogue", "timing", "gaps", "plan_runs", "plan_ratios")


def _bench(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def record(root: Path, reps: int = 3) -> tuple[Path, Path]:
    """Record the catalogue and the plan comparisons on vLLM under ``root`` (the vllm extra; ~20 minutes
    of wall time on a shared 2-core machine). Returns (catalogue dir, plans dir)."""
    cat, plans = root / "catalogue", root / "plans"
    for args in (["vllm_fidelity.py", "--dir", str(cat), "--record"],
                 ["vllm_plans.py", "--dir", str(plans), "--reps", str(reps)]):
        subprocess.run([sys.executable, str(BENCH / args[0]), *args[1:]], check=True, cwd=ROOT)
    return cat, plans


def build(catalogue_dir: Path, plans_dir: Path, reps_dir: Path | None = None) -> dict[str, pd.DataFrame]:
    """The notebook's tables from recorded run directories (see the module docstring); ``reps_dir``: repeated
    runs of some cases (``DIR/<case>/rep<k>``) for the spread of the measured means."""
    fidelity, timing = _bench("vllm_fidelity"), _bench("vllm_timing")
    cases = _bench("vllm_catalogue").select(None)
    rows = fidelity.analyse(catalogue_dir, cases, "vllm-v1")
    pc = {r["case"]: r["identical_%"] for r in fidelity.analyse(catalogue_dir, cases, "sarathi-pc")}
    catalogue = pd.DataFrame([{**r, "identical_sarathi_pc_%": pc[r["case"]]} for r in rows])
    runs = timing.load(catalogue_dir, None)
    reps = timing.load(reps_dir, None) if reps_dir is not None else {}
    tim = pd.DataFrame(timing.timing_table(runs, reps, "cpu", "absolute"))
    model = timing.cpu_fit(runs)
    gaps = pd.DataFrame([{"case": r["case"], "schedule": k[0], "objective": k[1], "value_s": r[k][0],
                          "bound_s": r[k][1], "gap_pct": r[k][2]}
                         for r in timing.gap_table(runs, model) for k in r if isinstance(k, tuple)])
    return {"catalogue": catalogue, "timing": tim, "gaps": gaps,
            "plan_runs": pd.read_csv(plans_dir / "runs.csv"), "plan_ratios": pd.read_csv(plans_dir / "ratios.csv"),
            "fit": model.describe()}


def write(tables: dict) -> None:
    DATA.mkdir(parents=True, exist_ok=True)
    for name in TABLES:
        tables[name].to_csv(DATA / f"{name}.csv", index=False, float_format="%.9g")
    (DATA / "cost_cpu_fit.json").write_text(json.dumps(tables["fit"], indent=1))


def load() -> dict[str, pd.DataFrame]:
    out = {name: pd.read_csv(DATA / f"{name}.csv", keep_default_na=False, na_values=[""]) for name in TABLES}
    out["fit"] = json.loads((DATA / "cost_cpu_fit.json").read_text())
    return out


def results(tables: dict) -> pd.DataFrame:
    """The claims' table (``claims_vllm.py``): one row per fidelity case, timing error, ratio and gap."""
    cat, tim, gaps, ratios = tables["catalogue"], tables["timing"], tables["gaps"], tables["plan_ratios"]
    parts = [pd.DataFrame({"kind": "fidelity", "case": cat["case"], "value": cat["identical_%"]}),
             pd.DataFrame({"kind": "timing", "case": tim["case"], "metric": "ttft", "value": tim["ttft_err"]}),
             pd.DataFrame({"kind": "timing", "case": tim["case"], "metric": "e2e", "value": tim["e2e_err"]}),
             pd.DataFrame({"kind": "gap", "case": gaps["case"], "schedule": gaps["schedule"],
                           "metric": gaps["objective"], "value": gaps["gap_pct"]}),
             ratios.rename(columns={"comparison": "case", "candidate": "schedule"}).assign(kind="ratio")]
    return pd.concat(parts, ignore_index=True)


def live_fidelity() -> pd.DataFrame:
    """The three runs kept whole (``tests/data/vllm``), judged and compared with the presets now (seconds)."""
    from infermax.engines.fidelity import compare_preset, judge
    from infermax.engines.records import load_engine_run, num_preemptions

    rows = []
    for d in sorted(p for p in RECORDED.iterdir() if (p / "schedule.json").is_file()):
        schedule, workload, limits, m = load_engine_run(d)
        row = {"case": d.name, "steps": len(schedule), "preemptions": num_preemptions(m.records),
               "judge": judge(schedule, workload, limits)}
        for preset in ("vllm-v1", "sarathi-pc"):
            c, _ = compare_preset(schedule, workload, limits, m.requests, m.records, preset)
            row[f"identical_{preset}_%"] = c.identical_pct
            row[f"first divergence ({preset})"] = c.divergence_text()
        rows.append(row)
    return pd.DataFrame(rows)
