"""The two ways a transform chain fails: a bad spec at build time, a bad record at run time.

``TransformConfigError`` is raised by ``build_chain`` before any record flows; it names the
place in the connector config (``sources.orders.transforms[2].fields``) and what is wrong, so
the connector refuses to start with a message an operator can act on. ``TransformError`` is
raised by ``Chain.apply`` when one transform fails on one record; it carries the transform's
position and type, the record *as it entered that transform*, and the original exception as
``cause`` (also ``__cause__``), so the batch cycle can send the record to the DLQ
(``errors.tolerance: all``) or fail the batch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rivven_connect.core.records import Record

__all__ = ["TransformConfigError", "TransformError"]


class TransformConfigError(ValueError):
    """A transform spec is invalid; ``path`` is where in the config, ``reason`` what."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class TransformError(Exception):
    """Transform number ``transform_index`` (``transform_type``) raised ``cause`` on
    ``record`` (the record as it entered that transform)."""

    def __init__(
        self, transform_index: int, transform_type: str, record: Record, cause: Exception
    ) -> None:
        super().__init__(
            f"transforms[{transform_index}] ({transform_type}) failed: "
            f"{type(cause).__name__}: {cause}"
        )
        self.transform_index = transform_index
        self.transform_type = transform_type
        self.record = record
        self.cause = cause
