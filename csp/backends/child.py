"""The child process of :func:`.base.run_isolated`: ``python -m infermax.csp.backends.child``.

Reads ``(module, function, payload, log)`` pickled from stdin, runs ``module.function(payload)``
and writes the pickled result (or the exception, as a RuntimeError naming its type) to what was
stdout. Anything the solver prints on stdout goes to stderr when ``log`` is true, else to the null
device, so that it can never corrupt the result.
"""
from __future__ import annotations

import importlib
import os
import pickle
import sys


def main() -> int:
    module, name, payload, log = pickle.loads(sys.stdin.buffer.read())
    result_fd = os.dup(1)
    if log:
        os.dup2(2, 1)
    else:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
    try:
        fn = importlib.import_module(module)
        for part in name.split("."):
            fn = getattr(fn, part)
        result = fn(payload)
    except BaseException as exc:  # noqa: BLE001 - shipped back to the parent and re-raised there
        result = RuntimeError(f"{type(exc).__name__}: {exc}")
    sys.stdout.flush()
    with os.fdopen(result_fd, "wb") as out:
        pickle.dump(result, out, protocol=pickle.HIGHEST_PROTOCOL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
