"""Tolerances for comparing floats from two different computations, scaled to the compared quantity.

Why not element-wise ``rtol``: two computations of the same tensor (packed vs padded, micro-batched vs
whole, another CPU kernel set) sum the same terms in another order. Their difference is bounded by the
magnitude of the *terms* (about ``sqrt(n) * eps * max|term|`` typically, ``n * eps`` in the worst case),
not by the magnitude of each result entry: an entry that is small because its terms cancel carries the
absolute error of the large ones, so an element-wise ``rtol`` holds on the CPU it was tuned on and fails
on the next. One absolute tolerance per compared tensor, ``rel * max(floor, max|expected|)``, is what
the arithmetic guarantees.

The constants (measured with ``ATEN_CPU_CAPABILITY`` = avx512 / avx2 / default, see .ci/run):

* ``F32 = 1e-5``: float32 (unit roundoff 6e-8). The tiny models' gradients (hidden 128, vocab 1024,
  sums over <= a few hundred tokens) differ between two orders of summation by <= 7e-7 of the tensor's
  max on every kernel set measured: >10x margin. A real bug (a value read at the wrong node, a token
  dropped, a factor missing) moves entries by >= 1e-2 of the max: 1000x above the tolerance.
* ``F64 = 1e-10``: float64 (unit roundoff 1.1e-16); ``n * eps`` for n <= 1e4 terms is 1e-12: 100x
  margin, and still 1e8x below a real bug.

Where the code is bit-deterministic by design (the same kernels on the same inputs in the same order,
e.g. multiplying by ones, or masking with ``torch.where``) the tests compare exactly and say so.
"""

from __future__ import annotations

import numpy as np
import torch

F32 = 1e-5
F64 = 1e-10


def default_rel(dtype: torch.dtype | np.dtype) -> float:
    """``F64`` for double precision, ``F32`` for anything narrower."""
    return F64 if dtype in (torch.float64, np.float64) else F32


def scaled_atol(expected: torch.Tensor | np.ndarray | float, rel: float, floor: float = 1.0) -> float:
    """``rel * max(floor, max|expected|)``: one absolute tolerance for a whole tensor (or a scalar)."""
    values = expected.detach().cpu().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    scale = float(np.max(np.abs(values))) if values.size else 0.0
    return rel * max(floor, scale)


def assert_close_scaled(
    actual: torch.Tensor,
    expected: torch.Tensor,
    rel: float | None = None,
    floor: float = 1.0,
    msg: str | None = None,
) -> None:
    """``|actual - expected| <= rel * max(floor, max|expected|)`` everywhere (``rel`` from the dtype
    when not given); same shape and dtype as ``torch.testing.assert_close`` checks."""
    rel = default_rel(expected.dtype) if rel is None else rel
    atol = scaled_atol(expected, rel, floor)
    err = (actual.detach() - expected.detach()).abs().max().item() if expected.numel() else 0.0
    note = f"max|diff| {err:.3g} > {atol:.3g} = {rel:g} * max({floor:g}, max|expected|)"
    torch.testing.assert_close(
        actual, expected, rtol=0.0, atol=atol, msg=f"{msg}: {note}" if msg else note
    )


def assert_differs_scaled(a: torch.Tensor, b: torch.Tensor, rel: float, floor: float = 0.0) -> None:
    """The opposite check, on the same scale: ``max|a - b| > rel * max(floor, max|b|)``, so float noise
    cannot make two tensors "differ" and a change has to be of the stated relative size."""
    err = (a.detach() - b.detach()).abs().max().item()
    atol = scaled_atol(b, rel, floor)
    assert err > atol, f"max|diff| {err:.3g} <= {atol:.3g} = {rel:g} * max|b|: the tensors do not differ"
