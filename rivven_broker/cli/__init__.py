"""Command-line entry points: ``rivven-broker`` (``broker_main``) and ``rivven`` (``rivven_main``).

Each module exposes ``main(argv=None) -> int`` (the exit code), declared as a console script
in pyproject.toml. The modules are imported only by their entry points, so this package
exports nothing itself.
"""

__all__: list[str] = []
