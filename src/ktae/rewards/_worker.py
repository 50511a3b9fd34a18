"""Symbolic equivalence worker, run as a separate process by :mod:`ktae.rewards.pool`.

Protocol: one JSON object per line on stdin, ``{"gold": str, "pred": str}``; one JSON
object per line on stdout, ``{"equal": bool}`` or ``{"error": str}``. The first line
written is ``{"ready": true}``. The process exits on end of input.

This file is executed by path (not imported as ``ktae.rewards._worker``) so that the
worker starts with math-verify and the standard library only. math-verify's own
signal-based timeouts are disabled (``parsing_timeout=None``, ``timeout_seconds=None``):
the parent enforces the deadline by killing this process.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
from functools import lru_cache

MEMORY_LIMIT_BYTES = 4 * 1024**3  # address space; a runaway 9^9^9^9 fails fast instead


def _setup() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when we stop
    logging.disable(logging.CRITICAL)  # math-verify warns on every disabled timeout
    sys.setrecursionlimit(10_000)


def _limit_memory() -> None:
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = MEMORY_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(hard,
                                                                              MEMORY_LIMIT_BYTES)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ImportError, ValueError, OSError):  # not on this platform: the deadline suffices
        pass


def main() -> int:
    _setup()
    out = sys.stdout  # the protocol channel; stray prints of any library go to stderr
    sys.stdout = sys.stderr
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def _parse(answer: str):
        return parse("\\boxed{" + answer + "}", extraction_config=config,
                     fallback_mode="no_fallback", parsing_timeout=None)

    parse_gold = lru_cache(maxsize=4096)(_parse)
    _limit_memory()
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            req = json.loads(line)
            gold, pred = parse_gold(req["gold"]), _parse(req["pred"])
            equal = bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))
            reply = {"equal": equal}
        except BaseException as e:  # noqa: BLE001 - MemoryError, RecursionError, anything
            reply = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
