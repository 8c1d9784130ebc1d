"""Grader worker: reads ``{"pred", "gold", "timeout"}`` JSON lines, answers ``{"ok": bool}`` lines.

Started by :class:`srpo_envs.grading.Grader` as ``python -I <this file>`` with its working
directory at the filesystem root: isolated mode ignores ``PYTHON*`` variables and the user site,
and puts neither the working directory nor this file's directory on ``sys.path``, so a
``math_verify.py`` lying in the caller's directory (or next to this file: the package has a
``math_verify`` env module) is never imported. That is also why this file imports nothing from
``srpo_envs``: it must run with only the standard library and the installed ``math_verify``.

Protocol: after importing math-verify it writes ``{"ready": true}`` (or ``{"ready": false,
"error": ...}`` and exits), so the parent can start workers ahead of need and never charge their
start-up to an answer. Each request gets ``{"ok": bool}`` or ``{"error": "..."}``; an error is a
grading *failure* the parent reports, never a silent "not equivalent". math-verify runs in the
main thread so its own signal-based timeouts work, while the parent enforces a hard wall-clock
bound by killing the process.
"""

from __future__ import annotations

import json
import sys


def verify_answers(pred: str, gold: str, timeout_s: float = 2.0) -> bool:
    """math-verify equivalence of two answer strings, in this process (math-verify's own timeouts)."""
    from math_verify import parse, verify

    seconds = max(1, int(timeout_s))
    gold_p = parse(f"\\boxed{{{gold}}}", parsing_timeout=seconds)
    pred_p = parse(f"\\boxed{{{pred}}}", parsing_timeout=seconds)
    if not gold_p or not pred_p:
        return False
    return bool(verify(gold_p, pred_p, timeout_seconds=seconds))


#: Graded once before "ready": math-verify and sympy build parsers and import submodules on first
#: use (~1 s), which would otherwise land on the first real answer's clock. Beyond the first three,
#: one case per kind of answer whose first use imported more of sympy (intervals, sets, degrees,
#: logs, trig identities, inequalities and matrices import nothing new): the first polynomial to
#: expand imported 17 ``sympy.physics.units`` modules (0.55 s on an idle machine, on the first
#: answer's 2 s clock), the first complex exponential ``sympy.sets.setexpr``. Every reply says how many modules the
#: answer imported (``imports``), so a kind missing here shows up in the tests, not as a timeout.
_WARM_UP = [
    ("\\frac{1}{2}", "0.5"),
    ("(3, \\pi/2)", "\\left( 3, \\frac{\\pi}{2} \\right)"),
    ("x^2 + 1", "1 + x^2"),
    ("x^2-1", "(x-1)(x+1)"),
    ("e^{i\\pi}", "-1"),
]


def _send(obj: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main() -> int:
    try:
        for pred, gold in _WARM_UP:  # imports math_verify: the slow start-up happens before "ready"
            verify_answers(pred, gold)
    except Exception as exc:  # noqa: BLE001 - reported to the parent, which raises it
        _send({"ready": False, "error": f"cannot start math_verify: {type(exc).__name__}: {exc}"})
        return 1
    _send({"ready": True})
    for line in sys.stdin:
        try:
            req = json.loads(line)
            loaded = len(sys.modules)
            ok = verify_answers(str(req["pred"]), str(req["gold"]), float(req.get("timeout", 2.0)))
        except Exception as exc:  # noqa: BLE001 - reported, not folded into "not equivalent"
            _send({"error": f"{type(exc).__name__}: {exc}"[:1000]})
            continue
        _send({"ok": bool(ok), "imports": len(sys.modules) - loaded})
    return 0


if __name__ == "__main__":
    sys.exit(main())
