"""Several schedulers from one command line (``simulate``, ``bound``): refusals beside the results.

Each scheduler runs on its own: one that refuses the instance (a ``ValueError``: e.g. a scheduler
without chunked prefill given a prompt longer than ``min(C, P)``) or fails (any other exception: a
bug) is recorded as a :class:`Refusal` and the others still run; results already computed are
never thrown away. Ctrl-C stops the loop and keeps what finished (:func:`run_each` returns it with
``interrupted`` set; the command prints it, then exits 130).

Default sets: a command's default schedulers must run the shipped traces
(``trace:splitwise_conv`` has prompts of up to 14,050 tokens, ``trace:splitwise_code`` 7,437,
against the default ``C = 4096``). A default scheduler without chunked prefill is left out of
the default set, with a note saying so, when a prompt is longer than its ``min(C, P)``
(:func:`left_out`); named with ``--scheduler`` it is run and its refusal reported.

Exit statuses (:func:`exit_status`, documented in :mod:`infermax.cli`): 0 every scheduler ran,
4 some refused (the others' results are printed), 5 every one refused, 1 one failed with an
internal error.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .rundir import one_line

EXIT_SOME_REFUSED, EXIT_ALL_REFUSED, EXIT_INTERNAL = 4, 5, 1


@dataclass(frozen=True, slots=True)
class Refusal:
    """A scheduler that did not run: ``reason`` (one line); ``internal``: a bug rather than a refusal."""

    scheduler: str
    reason: str
    internal: bool = False
    traceback: str | None = None      # of an internal error (the CLI shows it with -v)

    def line(self) -> str:
        return f"{self.scheduler}: {'failed' if self.internal else 'refused'}: {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler, "refused": not self.internal, "error": self.reason}


@dataclass(frozen=True, slots=True)
class Runs:
    """What :func:`run_each` got: (name, result) of the schedulers that ran, in order; the refusals;
    whether Ctrl-C stopped the loop."""

    done: list[tuple[str, Any]]
    refused: list[Refusal]
    interrupted: bool = False


def run_each(names: Sequence[str], run: Callable[[str], Any]) -> Runs:
    """``run(name)`` for each name, each failure recorded beside the others' results."""
    done: list[tuple[str, Any]] = []
    refused: list[Refusal] = []
    for name in names:
        try:
            done.append((name, run(name)))
        except KeyboardInterrupt:
            return Runs(done, refused, interrupted=True)
        except ValueError as exc:
            refused.append(Refusal(name, one_line(str(exc))))
        except Exception as exc:  # noqa: BLE001 - a bug in one scheduler must not throw away the others' results
            refused.append(Refusal(name, f"internal error: {type(exc).__name__}: {one_line(str(exc))}",
                                   internal=True, traceback=traceback.format_exc()))
    return Runs(done, refused)


def exit_status(runs: Runs) -> int:
    """1 if a scheduler failed with an internal error, else 5 if every one refused, 4 if some did, else 0."""
    if any(r.internal for r in runs.refused):
        return EXIT_INTERNAL
    if not runs.refused:
        return 0
    return EXIT_ALL_REFUSED if not runs.done else EXIT_SOME_REFUSED


def without_chunking(name: str, workload, limits) -> str | None:
    """Why the scheduler ``name`` cannot serve ``workload`` for want of chunked prefill (None if it can):
    it has none, and a prompt is longer than its ``min(C, P)``."""
    from .schedulers import get_scheduler

    policy = getattr(get_scheduler(name), "policy", None)
    if policy is None or getattr(policy, "chunked_prefill", True):
        return None
    cap = min(limits.C, limits.P)
    for bound in (getattr(policy, "C", None), getattr(policy, "P", None)):
        if bound is not None:
            cap = min(cap, bound)
    longest = int(workload.input_lens.max())
    return None if longest <= cap else f"no chunked prefill, and a prompt has {longest} tokens > min(C, P) = {cap}"


def left_out(names: Sequence[str], workload, limits, fallback: str = "sarathi") -> tuple[list[str], list[str]]:
    """(kept, notes): the default ``names`` that can serve ``workload``, and one note per one left out;
    ``fallback`` (chunked prefill: any prompt) when none is left."""
    kept, out = [], {}
    for name in names:
        why = without_chunking(name, workload, limits)
        if why is None:
            kept.append(name)
        else:
            out.setdefault(why, []).append(name)
    notes = [f"{', '.join(left)} left out of the default schedulers: {why} (name {'it' if len(left) == 1 else 'them'} "
             f"with --scheduler to run {'it' if len(left) == 1 else 'them'})" for why, left in out.items()]
    if not kept:
        kept = [fallback]
        notes.append(f"running {fallback} instead (chunked prefill serves any prompt)")
    return kept, notes


def schedulers_to_run(spec: str | None, default: str, workload, limits) -> tuple[list[str], list[str]]:
    """(names, notes): the schedulers of ``spec`` (comma separated), each a known one (an unknown name fails
    before any work); ``None``: those of ``default`` that can serve ``workload`` (:func:`left_out`, its notes)."""
    from .schedulers import get_scheduler, split_specs

    names = split_specs(default if spec is None else spec)
    if not names:
        raise ValueError(f"--scheduler {spec!r} names no scheduler")
    for name in names:
        get_scheduler(name)
    return left_out(names, workload, limits) if spec is None else (names, [])
