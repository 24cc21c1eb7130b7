"""Palimpsest benchmarks (`make bench`, or `python -m bench [module ...]`).

Every module in this package whose name does not start with `_` is a benchmark: it exposes
`async def run(args) -> str` returning markdown (a table and its notes). Set `NEEDS_POSTGRES = False`
in a module that does not need the database. Shared helpers are in `bench._common`.
"""
