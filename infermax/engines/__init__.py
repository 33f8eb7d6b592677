"""Adapters to real serving engines (vLLM first): an optional extra, never imported by the core.

The pure parts import no engine and run anywhere:

- :mod:`.records` turns the step records of an engine run (tokens per request per step, the
  requests preempted before it, measured step times) into an infermax :class:`~infermax.Schedule`
  and its measurements;
- :mod:`.vllm_config` maps infermax :class:`~infermax.Limits` one to one onto vLLM's engine options
  and names the random-weight model shapes;
- :mod:`.plans` turns a Schedule into the per-step orders an engine executes and refuses, naming the
  limit, a plan the engine could not run; :mod:`.validation` predicts and measures the schedules
  compared on the engine.

:mod:`.vllm_engine` runs a Workload on vLLM (``pip install -e ".[vllm]"``); the ``infermax vllm run``
command (:mod:`.cli`) writes what it recorded as a run directory that ``replay`` and ``bound`` read.
:mod:`.vllm_plan` makes vLLM execute a given Schedule step for step (``infermax vllm execute``).
"""
