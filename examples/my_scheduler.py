"""A scheduler written outside infermax, for `infermax bound` (docs/howto/bound.md, "Bound your scheduler").

Decodes every running request, then admits waiting requests shortest prompt
first, whole prompts only, reserving each one's peak KV (I + O - 1) so that it
never has to evict.
"""
import numpy as np

from infermax.schedulers import Plan, Scheduler
from infermax.state import Status


class ShortestPromptFirst(Scheduler):
    name = "shortest-prompt-first"

    def next_batch(self, state) -> Plan:
        running = np.flatnonzero(state.status == Status.RUNNING)     # holds KV
        waiting = np.flatnonzero(state.status == Status.WAITING)     # arrived, holds no KV
        peak = state.input_lens + state.output_lens - 1
        free_kv = state.limits.M - int(peak[running].sum())
        budget = state.limits.C - running.size
        idx, tokens = list(running), [1] * running.size   # every running request decodes
        for i in waiting[np.argsort(state.inp[waiting], kind="stable")]:
            if state.inp[i] > min(budget, state.limits.P) or peak[i] > free_kv:
                break
            idx.append(i)
            tokens.append(int(state.inp[i]))
            budget -= int(state.inp[i])
            free_kv -= int(peak[i])
        return Plan(np.array(idx, dtype=np.int64), np.array(tokens, dtype=np.int64), np.zeros(0, dtype=np.int64))
