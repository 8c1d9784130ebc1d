"""Grader worker: reads ``{"pred", "gold", "timeout"}`` JSON lines, answers ``{"ok": bool}`` lines.

Started by :class:`srpo_envs.grading.Grader`; runs math-verify in its main thread so math-verify's
own signal-based timeouts work, while the parent enforces a hard wall-clock bound by killing it.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from srpo_envs.grading import verify_answers

    for line in sys.stdin:
        try:
            req = json.loads(line)
            ok = verify_answers(str(req["pred"]), str(req["gold"]), float(req.get("timeout", 2.0)))
        except Exception:  # noqa: BLE001 - any failure grades as "not equivalent"
            ok = False
        sys.stdout.write(json.dumps({"ok": bool(ok)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
