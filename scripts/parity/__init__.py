"""Run deepagents' own RubricMiddleware tests against rubric_core, from a checkout you supply.

Nothing of deepagents is shipped here: ``scripts/deepagents_parity.py --upstream PATH`` reads
their test file from a deepagents checkout (or git dir, or the file itself), copies it into a
temporary directory with its two imports pointed at ``parity.shim``, runs it in a child pytest
with ``parity.plugin`` and checks every outcome against ``parity.tables``.

- ``shim.py``: the names their test file imports, mapped onto ours.
- ``tables.py``: where their file is, which of its tests are left out and which differ on
  purpose, and why; the outcome counts we pin.
- ``plugin.py``: the pytest plugin that applies the tables and runs their ``async def`` tests.
"""
