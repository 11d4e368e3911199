"""deepagents' own RubricMiddleware tests, run against rubric_core.

- ``upstream_test_rubric_middleware.py``: their test file, vendored under its MIT license
  (``LICENSE-deepagents``); only its two imports changed, to ``deepagents_parity.shim``.
- ``shim.py``: the names it imports, mapped onto ours.
- ``tables.py``: which upstream tests are left out and which differ on purpose, and why.
- ``conftest.py``: applies the tables and runs upstream's ``async def`` tests.

``tests/test_deepagents_parity.py`` runs the suite and pins every outcome. The file is vendored
rather than read from a local deepagents checkout because CI runs on a clean clone.
"""
