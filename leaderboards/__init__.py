"""Leaderboards: validated, hashed result records with their evidence, a JSON store, pages.

The main names import from the package itself, lazily."""

from srpo_common.lazy import lazy_exports

_EXPORTS = {
    "LeaderboardRecord": "leaderboards.schema",
    "RecordValidationError": "leaderboards.schema",
    "make_record": "leaderboards.schema",
    "validate_record": "leaderboards.schema",
    "LeaderboardStore": "leaderboards.store",
    "load_all": "leaderboards.store",
    "submit": "leaderboards.store",
    "export_record": "leaderboards.export",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
