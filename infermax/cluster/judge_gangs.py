"""The cluster judge's gang rules: a long request on a gang of replicas, as the schedule records it.

Read from the document alone (:func:`read_gang`): its price against the
cluster's (``gang-price``), its prefill segments (``resume``), its decode steps
(``gang-busy``, ``once``). Against the replayed replicas
(:func:`check_gang_on_replicas`): its members' batches (``gang-busy``,
``gang-time``, ``colocate-cap``) and the KV they hold for it (``hold``). The
rules are listed in :mod:`infermax.cluster.judge`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infermax.types import Limits, Workload

from .csps import decode_phases, kv_gather_phases
from .gang import DECODE, PREFILL, decode_comm_s
from .policies import get_policy
from .schedule_doc import ClusterScheduleError
from .spec import Cluster

REL_TOL = 1e-9          # times recomputed along another path agree to this relative precision


def at_least(x: float, need: float) -> bool:
    return x >= need - REL_TOL * abs(need) - 1e-12


_ONE = np.ones(1, dtype=np.int64)
_DECODE = np.ones(1, dtype=bool)


@dataclass
class JudgedGang:
    """One gang as the judge reads it, with its reference price."""

    gid: int
    i: int                        # request index
    rid: int                      # request id
    members: tuple[int, ...]
    share: int
    unit_s: float
    switch_s: float
    saved_tokens: int             # KV-token equivalent of the activations kept while suspended
    segments: list[dict]
    decodes: list[dict]
    gaps: list[tuple[float, float]]     # (suspended at, resumed at)
    colocated: dict = field(default_factory=dict)   # (decode step, member) -> its colocated batch there
    gather: bool = False          # csps-kvdecode: the first member gathers the KV and attends alone
    scaled_down: bool = False     # its KV left for a decode instance after the prefill (LoongServe)

    @property
    def start_s(self) -> float:
        return float(self.segments[0]["start_s"])

    @property
    def end_s(self) -> float:
        return float((self.decodes or self.segments)[-1]["end_s"])


# --- what the document says, checked on its own ---------------------------------------------------------
# complexity: one check per field of a gang entry, each naming the gang and the value
def read_gang(gid: int, g: dict, workload: Workload, pos: dict, cluster: Cluster, meta: dict) -> JudgedGang:
    rid = int(g["request"])           # (the document's reader checked every field's type)
    if rid not in pos:
        raise ClusterScheduleError("unknown-request", f"gangs[{gid}].request = {rid} is not in the workload")
    i, members, steps = pos[rid], tuple(int(r) for r in g["members"]), list(g["steps"])
    where = f"gang {gid} (request {rid})"
    if not members or len(set(members)) != len(members) or min(members) < 0 or max(members) >= cluster.num_replicas:
        raise ClusterScheduleError("format", f"{where}: members {list(members)} must be distinct replicas of "
                                   f"0..{cluster.num_replicas - 1}")
    I, O = int(workload.input_lens[i]), int(workload.output_lens[i])
    if (int(g.get("input_len", I)), int(g.get("output_len", O))) != (I, O):
        raise ClusterScheduleError("format", f"{where}: input/output {g.get('input_len')}/{g.get('output_len')} "
                                   f"but the workload says {I}/{O}")
    ref = _reference_gang(cluster, gid, i, members, I, O, meta)
    k = len(members)
    _check_price(where, g, ref, k, I + O - 1)
    _check_share_fits(where, int(g["share_tokens"]), Limits(**meta["limits"]))
    _check_plan(where, g, ref)
    segments = [s for s in steps if s.get("phase") == PREFILL]
    decodes = [s for s in steps if s.get("phase") == DECODE]
    if len(segments) + len(decodes) != len(steps):
        raise ClusterScheduleError("format", f"{where}: a step's phase is neither {PREFILL!r} nor {DECODE!r}")
    if not segments:
        raise ClusterScheduleError("resume", f"{where}: no prefill segment")
    if steps[:len(segments)] != segments:
        raise ClusterScheduleError("gang-busy", f"{where}: a decode step comes before a prefill segment")
    out = JudgedGang(gid, i, rid, members, int(g["share_tokens"]), float(g["prefill_s"]) / int(g["units"]),
                float(g["switch_s"]), math.ceil(ref.saved_bytes / cluster.model.kv_bytes_per_token),
                segments, decodes, [])
    variant = _csps_of(meta)
    out.gather = variant is not None and variant.decode == "kv"
    if out.start_s < float(workload.arrivals_s[i]):
        raise ClusterScheduleError("arrival", f"{where}: prefill starts at {out.start_s!r} s, before the request "
                                   f"arrives at {float(workload.arrivals_s[i])!r} s")
    _check_segments(out, where, int(g["units"]))
    out.scaled_down = _scales_down(meta) and O > 1
    if not out.scaled_down:
        _check_decodes(out, where, I, O)
    elif decodes:
        raise ClusterScheduleError("once", f"{where}: {len(decodes)} decode steps on the gang, but under policy "
                                   f"{meta.get('policy')!r} its KV leaves for a decode instance after the prefill")
    return out


def _scales_down(meta: dict) -> bool:
    """Whether the schedule's policy moves a gang's KV to a decode instance after its prefill (LoongServe).
    (The document's reader refused a meta without a known policy.)"""
    return get_policy(meta["policy"]).scale_down


def _reference_gang(cluster: Cluster, gid: int, i: int, members: tuple, I: int, O: int, meta: dict) -> Any:
    """The gang as the cluster prices it: the policy's SP plan on these members (its ring sharded as the run's
    ``ring_attention`` option says, else as the policy's own)."""
    pol = get_policy(meta["policy"])
    ring = meta.get("options", {}).get("ring_attention")
    return pol.gang(cluster, gid, i, members, I, O, None if ring is None else ring == "striped")


def _csps_of(meta: dict) -> Any:
    """The CSPS variant of the schedule's policy (None for the others)."""
    return get_policy(meta["policy"]).csps


def _check_plan(where: str, g: dict, ref: Any) -> None:
    """A CSPS gang's recorded SP plan is the one its policy prices on its members (kind, GPUs, transfers)."""
    if ref.plan is None:
        return
    got = g.get("plan")
    if not isinstance(got, dict):
        raise ClusterScheduleError("format", f"{where}: a CSPS gang needs its SP plan")
    p = ref.plan
    for key, want in (("kind", p.kind), ("num_gpus", p.num_gpus), ("micro", p.micro)):
        if got.get(key) != want:
            raise ClusterScheduleError("gang-price", f"{where}: plan {key} = {got.get(key)!r}, but its policy's plan "
                                       f"on members {list(ref.members)} has {want!r}")
    for key in ("comm_in_s", "comm_out_s", "bytes_per_gpu"):
        if not at_least(float(got.get(key, -1.0)), getattr(p, key)):
            raise ClusterScheduleError("gang-price", f"{where}: plan {key} = {got.get(key)!r} < {getattr(p, key)!r}, "
                                       f"what its transfers take")


def _check_price(where: str, g: dict, ref: Any, k: int, peak: int) -> None:
    got = {key: g.get(key) for key in ("prefill_s", "units", "switch_s", "share_tokens")}
    if any(v is None for v in got.values()):
        raise ClusterScheduleError("format", f"{where}: needs prefill_s, units, switch_s and share_tokens")
    if not at_least(float(got["prefill_s"]), ref.prefill_s):
        raise ClusterScheduleError("gang-price", f"{where}: prefill_s = {got['prefill_s']!r} s < "
                                   f"{ref.prefill_s!r} s, the price of its plan on members {list(ref.members)}")
    if int(got["units"]) != ref.units:
        raise ClusterScheduleError("gang-price", f"{where}: units = {got['units']} but the model has {ref.units} "
                                   f"kernel boundaries")
    if not at_least(float(got["switch_s"]), ref.switch_s):
        raise ClusterScheduleError("gang-price", f"{where}: switch_s = {got['switch_s']!r} s < {ref.switch_s!r} s "
                                   f"to save and restore the suspended activations")
    if int(got["share_tokens"]) < math.ceil(peak / k):
        raise ClusterScheduleError("gang-price", f"{where}: share_tokens = {got['share_tokens']} cannot hold "
                                   f"ceil({peak} / {k}) KV tokens per member")


def _check_share_fits(where: str, share: int, limits: Limits) -> None:
    """Rule ``M``: a member holds the gang's KV share for the gang's whole life, so it fits one replica."""
    if share > limits.M:
        raise ClusterScheduleError("M", f"{where}: share_tokens = {share} > M = {limits.M}, a replica's KV capacity")
    if limits.block_size > 1 and int(limits.kv_blocks(share)) > limits.num_blocks:
        raise ClusterScheduleError("M-blocks", f"{where}: share_tokens = {share} take {int(limits.kv_blocks(share))} "
                                   f"blocks > M // block_size = {limits.num_blocks}")


def _check_segments(g: JudgedGang, where: str, units: int) -> None:
    """Rule ``resume``: contiguous units from 0 to ``units``, in time order, each long enough."""
    at, prev_end = 0, -math.inf
    for k, s in enumerate(g.segments):
        lo, hi = (int(x) for x in s["units"])
        start, end = float(s["start_s"]), float(s["end_s"])
        here = f"{where}, prefill segment {k} [{start!r}, {end!r}] s, units [{lo}, {hi}]"
        if lo != at or hi < lo or hi > units:
            raise ClusterScheduleError("resume", f"{here}: must resume at unit {at} (of {units})")
        if start < prev_end:
            raise ClusterScheduleError("resume", f"{here}: starts before the previous segment ends at {prev_end!r} s")
        switch = g.switch_s if k > 0 else 0.0
        need = (hi - lo) * g.unit_s + switch
        if not at_least(end - start, need):
            raise ClusterScheduleError("resume", f"{here}: lasts {end - start!r} s < {need!r} s for its units"
                                       + (f" and the {switch!r} s switch" if switch else ""))
        last = k == len(g.segments) - 1
        if bool(s.get("suspended")) == last:
            raise ClusterScheduleError("resume", f"{here}: " + ("the last segment is suspended and never resumed"
                                       if last else "is followed by another but not marked suspended"))
        if not last:
            g.gaps.append((end, float(g.segments[k + 1]["start_s"])))
        at, prev_end = hi, end
    if at != units:
        raise ClusterScheduleError("resume", f"{where}: the prefill stops at unit {at} of {units}")


def _check_decodes(g: JudgedGang, where: str, I: int, O: int) -> None:
    """Decode steps after the prefill, in time order, gen = 1, 2, ...; their shares cover the cache."""
    prev_end = float(g.segments[-1]["end_s"])
    for k, s in enumerate(g.decodes):
        start, end, gen = float(s["start_s"]), float(s["end_s"]), int(s["gen"])
        here = f"{where}, decode step {k} (gen {gen}) [{start!r}, {end!r}] s"
        if gen != k + 1:
            raise ClusterScheduleError("gang-busy", f"{here}: decode step {k} must be gen {k + 1}")
        if gen >= O:
            raise ClusterScheduleError("once", f"{here}: the request already has its O = {O} tokens")
        if start < prev_end or end < start:
            raise ClusterScheduleError("gang-busy", f"{here}: starts before the previous step ends at {prev_end!r} s")
        shares = [int(x) for x in s["shares"]]
        if len(shares) != len(g.members) or sum(shares) != I + gen - 1 or max(shares) > g.share:
            raise ClusterScheduleError("gang-price", f"{here}: shares {shares} must split the {I + gen - 1} cached "
                                       f"tokens over the {len(g.members)} members, at most {g.share} each")
        prev_end = end
    if len(g.decodes) != O - 1:
        raise ClusterScheduleError("once", f"{where}: {len(g.decodes)} decode steps, the request needs "
                                   f"O - 1 = {O - 1}")


def colocated_batches(gangs: list[JudgedGang], R: int) -> list[dict[int, tuple[JudgedGang, int, int]]]:
    """Per replica: batch index -> (gang, decode step, member position) of a colocated long decode."""
    out: list[dict] = [{} for _ in range(R)]
    for g in gangs:
        for k, s in enumerate(g.decodes):
            seen = set()
            for r, j in s.get("colocated", ()):
                r, j = int(r), int(j)
                where = f"gang {g.gid} (request {g.rid}), decode step {k}: colocated batch {j} of replica {r}"
                if r not in g.members or r in seen:
                    raise ClusterScheduleError("gang-busy", f"{where}: not a member, or listed twice")
                if j in out[r]:
                    raise ClusterScheduleError("gang-busy", f"{where}: already carries another decode step")
                seen.add(r)
                out[r][j] = (g, k, g.members.index(r))
                g.colocated[(k, r)] = j
    return out


# --- against the replayed replicas ------- ---------------------------------------------------------------
# complexity: one check per gang rule on each member replica (busy, KV, times), in order
def check_gang_on_replicas(g: JudgedGang, runs: list[Any], cost: Any, cluster: Cluster, meta: dict) -> None:
    cap = (meta.get("options") or {}).get("colocate_tokens")
    variant = _csps_of(meta)
    csps, gather = variant is not None, variant is not None and variant.decode == "kv"
    q_ship, comm = decode_phases(cluster, g.members) if csps else (0.0, decode_comm_s(cluster, g.members))
    where = f"gang {g.gid} (request {g.rid})"
    for r in g.members:
        run = runs[r]
        starts, ends = run.trace.batches["start_s"], run.ends
        for k, s in enumerate(g.segments):
            b = _first_overlap(starts, ends, float(s["start_s"]), float(s["end_s"]))
            if b is not None:
                raise ClusterScheduleError("gang-busy", f"{where}: replica {r} runs batch {b} [{float(starts[b])!r}, "
                                           f"{float(ends[b])!r}] s during prefill segment {k} [{s['start_s']!r}, "
                                           f"{s['end_s']!r}] s")
        for k, s in enumerate(g.decodes):
            start, end = float(s["start_s"]), float(s["end_s"])
            j = g.colocated.get((k, r))
            here = f"{where}, decode step {k} [{start!r}, {end!r}] s on replica {r}"
            if gather:                    # the first member gathers the KV shards, then attends over all of it
                q_ship, comm = kv_gather_phases(cluster, g.members, sum(int(x) for x in s["shares"]))
            attend = _q_arrival(s, here, start, q_ship, "kv_gather" if gather else "q_ship") if csps else start
            tokens = attended_tokens(s, g.members.index(r), gather)
            busy_until = attend + float(cost.batch_time(_ONE, np.array([tokens]), _DECODE)) if tokens else start
            if j is not None and csps and not at_least(float(starts[j]), attend):
                raise ClusterScheduleError("q-ship", f"{here}: its colocated batch {j} attends from "
                                           f"{float(starts[j])!r} s, before the token's Q arrives at {attend!r} s")
            if j is not None:
                if starts[j] < start or ends[j] > end:
                    raise ClusterScheduleError("gang-busy", f"{here}: its colocated batch {j} [{float(starts[j])!r}, "
                                               f"{float(ends[j])!r}] s lies outside the step")
                if cap is not None and int(run.trace.batches["num_tokens"][j]) > int(cap):
                    raise ClusterScheduleError("colocate-cap", f"{here}: colocated batch {j} processes "
                                               f"{int(run.trace.batches['num_tokens'][j])} tokens > "
                                               f"colocate_tokens = {cap}")
                busy_until = float(ends[j])
            b = _first_overlap(starts, ends, start, end, skip=j)
            if b is not None:
                besides = " besides its colocated batch" if j is not None else ""
                raise ClusterScheduleError("gang-busy", f"{here}: batch {b} [{float(starts[b])!r}, "
                                           f"{float(ends[b])!r}] s runs during the step{besides}")
            if not at_least(end, busy_until + comm):
                raise ClusterScheduleError("gang-time", f"{here}: ends at {end!r} s, before the member's decode "
                                           f"({busy_until!r} s) plus the Q/output exchange ({comm!r} s)")
        _check_hold(g, r, run)


def attended_tokens(step: dict, member: int, gather: bool) -> int:
    """KV tokens member ``member`` (its position) attends over in a decode step: its share, or, when the
    first member gathers the KV (``csps-kvdecode``), all of them there and none elsewhere."""
    shares = [int(x) for x in step["shares"]]
    if not gather:
        return shares[member]
    return sum(shares) if member == 0 else 0


def _q_arrival(step: dict, here: str, start: float, q_ship: float, key: str = "q_ship") -> float:
    """Rule ``q-ship`` (CSPS decode, CSPS §4.2): the step ships the token's Q (``csps-kvdecode``: gathers
    the KV) from its start for at least the priced first-layer transfer; the members attend only after it
    arrives. The arrival time."""
    try:
        sent, arrived = (float(x) for x in step[key])
    except (KeyError, TypeError, ValueError):
        raise ClusterScheduleError("format", f"{here}: a CSPS decode step needs {key} = [sent_s, arrived_s]"
                                   ) from None
    if not at_least(sent, start) or not at_least(arrived - sent, q_ship):
        raise ClusterScheduleError("q-ship", f"{here}: {key} over [{sent!r}, {arrived!r}] s; it must start with "
                                   f"the step and take at least {q_ship!r} s")
    return arrived


def _first_overlap(starts: np.ndarray, ends: np.ndarray, lo: float, hi: float, skip: int | None = None
                   ) -> int | None:
    """The first batch whose [start, end) meets (lo, hi) other than ``skip`` (batches run one after another)."""
    b = int(np.searchsorted(ends, lo, side="right"))
    while b < starts.size and starts[b] < hi:
        if b != skip and ends[b] > lo:
            return b
        b += 1
    return None


def _check_hold(g: JudgedGang, r: int, run: Any) -> None:
    """Rule ``hold``: at every batch and hold change of member r while g is alive, the held KV covers the
    gang's share (and the saved activations while it is suspended)."""
    where = f"gang {g.gid} (request {g.rid}), replica {r}"
    A, Z = g.start_s, g.end_s
    starts, ends = run.trace.batches["start_s"], run.ends
    for j in np.flatnonzero((starts < Z) & (ends > A)).tolist():
        need = g.share + (g.saved_tokens if any(a <= starts[j] < b for a, b in g.gaps) else 0)
        if run.held[j] < need:
            raise ClusterScheduleError("hold", f"{where}: batch {j} at {float(starts[j])!r} s runs with "
                                       f"{int(run.held[j])} KV tokens held, the gang needs {need}")
    holds = [(float(e[1]), int(e[4])) for e in run.events if e[2] == "hold"]
    at_start = [v for t, v in holds if t <= A]
    level = at_start[-1] if at_start else 0
    if level < g.share:
        raise ClusterScheduleError("hold", f"{where}: holds {level} KV tokens when the gang starts at {A!r} s, "
                                   f"its share is {g.share}")
    for t, v in holds:
        if A < t < Z and v < g.share:
            raise ClusterScheduleError("hold", f"{where}: holds {v} KV tokens at {t!r} s, its share is {g.share}")


def check_one_gang_at_a_time(gangs: list[JudgedGang]) -> None:
    busy: dict[int, JudgedGang] = {}
    for g in sorted(gangs, key=lambda x: x.start_s):
        for r in g.members:
            prev = busy.get(r)
            if prev is not None and prev.end_s > g.start_s:
                raise ClusterScheduleError("gang-busy", f"replica {r} is in gang {prev.gid} (request {prev.rid}) "
                                           f"until {prev.end_s!r} s and in gang {g.gid} (request {g.rid}) from "
                                           f"{g.start_s!r} s")
            busy[r] = g
