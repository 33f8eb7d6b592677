"""Ranking schedulers of InferMax App. A.3: one group ordered by a request key.

Rank_org keeps arrival order, Rank_I orders by input length, Rank_O by output
length (shortest first). Built on Algorithm 1 with a single group, hybrid
batching and chunked prefill (P=C); a candidate that cannot be allocated is
skipped so that lower-ranked requests can still fill the batch, and a decode
short of KV evicts lower-ranked running requests.
"""
from .presets import register_family

for _name, _key, _what in (("rank-org", "arrival", "arrival order"),
                           ("rank-i", "input", "shortest input first"),
                           ("rank-o", "output", "shortest output first")):
    register_family(_name, f"Rank ({_what}): one group, hybrid batching, chunked prefill, P=C",
                    priority="rank", hybrid=True, chunked_prefill=True, rank_key=_key, skip_on_fail=True,
                    lookahead=False)
