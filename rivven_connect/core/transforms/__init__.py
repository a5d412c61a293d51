"""Transforms: pure ``Record -> Record | None`` functions configured from raw spec dicts.

The connector config's ``transforms:`` list becomes a ``Chain`` (``build_chain``), run on every
record between the source and admission. Families, one module each: ``filtering`` (Filter),
``fields`` (MaskField, ReplaceField, InsertField, ValueToKey, Flatten), ``conversions`` (Cast,
TimestampConverter), ``cdc`` (ExtractNewRecordState), ``routing`` (RegexRouter, ContentRouter,
Route), ``outbox`` (EventRouter); ``predicates`` gates any of them; ``paths`` is the dotted
path grammar; ``options`` reads and checks specs; ``chain`` assembles and runs. No I/O, no
clock, no randomness: the same chain serves the driver, the tests and the simulator.
docs/connect-transforms.md is the user-facing reference.
"""

from rivven_connect.core.transforms.chain import TRANSFORM_TYPES, Chain, build_chain
from rivven_connect.core.transforms.errors import TransformConfigError, TransformError
from rivven_connect.core.transforms.predicates import Predicate, parse_predicate

__all__ = [
    "TRANSFORM_TYPES",
    "Chain",
    "Predicate",
    "TransformConfigError",
    "TransformError",
    "build_chain",
    "parse_predicate",
]
