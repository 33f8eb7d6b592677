"""Callable modules: ``infermax.replay`` is the module *and* calling it calls its function ``replay``.

The modules ``infermax.replay``, ``infermax.metrics``, ``infermax.starvation`` and the packages
``infermax.sweep`` and ``infermax.execute`` each define a function of their own name. Each ends with
``sys.modules[__name__].__class__ = CallableModule``, so that

    >>> import infermax.metrics
    >>> callable(infermax.metrics), infermax.metrics.metrics_by_tag.__module__
    (True, 'infermax.metrics')

``infermax.replay(schedule, workload)`` calls ``infermax.replay.replay(schedule, workload)``;
``from infermax import replay`` gives the (callable) module and ``from infermax.replay import replay``
the plain function. A leaf: it imports nothing of the package.
"""
from __future__ import annotations

import inspect
import types


class CallableModule(types.ModuleType):
    """A module whose call is the call of its function of the same name (``infermax.sweep(cfg)`` is
    ``infermax.sweep.sweep(cfg)``); ``inspect.signature`` of the module is that function's, ``help`` and
    ``__doc__`` are the module's own."""

    def _function(self):
        """The function named as the module's last component (``replay`` of ``infermax.replay``)."""
        return getattr(self, self.__name__.rpartition(".")[2])

    def __call__(self, *args, **kwargs):
        return self._function()(*args, **kwargs)

    @property
    def __signature__(self) -> inspect.Signature:
        return inspect.signature(self._function())
