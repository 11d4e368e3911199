"""The library: saved rubrics (each version with its settings preset) and saved datasets.

- ``rubrics`` and ``rubric_versions``: saved rubrics, every version kept, each with the
  `RunSettings` preset it was saved with (``settings_json``: prompt, tools, models, cap);
- ``datasets``: saved datasets, every version kept (as the checked JSONL of its rows).

Both are versioned the same way: a save reads the latest version under a lock on the name and
writes the next one, unless it would be identical; a load reads version N, or the latest, with
`versioned_row`.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from rubric_core.datasets import Dataset, rows_from_jsonl
from rubric_core.redact import redact, secret_values
from rubric_core.settings import RunSettings
from rubric_core.store._core import StoreCore, check_name
from rubric_core.store._records import DatasetInfo, dataset_info_from_row

if TYPE_CHECKING:
    from rubric_core.store._schema import Tx

VERSIONED_TABLES = frozenset({"rubric_versions", "datasets"})
"""Tables keyed by ``(name, version)``, versions counted from 1 per name."""


def versioned_row(conn: Tx, table: str, name: str, version: int | None, columns: str) -> Any:
    """``columns`` of ``name`` at ``version`` in a versioned table (the latest when None).

    Args:
        conn: The operation's connection.
        table: One of `VERSIONED_TABLES`.
        name: The (stripped) name.
        version: A version number, or None for the latest.
        columns: The columns to read, as SQL (``"version, text"``).

    Returns:
        The row, or None when there is no such name or version.

    """
    if table not in VERSIONED_TABLES:
        msg = f"{table!r} is not a versioned table: expected one of {sorted(VERSIONED_TABLES)}"
        raise ValueError(msg)
    sql = f"SELECT {columns} FROM {table} WHERE name = ?"
    params: list[Any] = [name]
    if version is None:
        sql += " ORDER BY version DESC LIMIT 1"
    else:
        sql += " AND version = ?"
        params.append(version)
    return conn.execute(sql, params).fetchone()


class LibraryStore(StoreCore):
    """The store's rubric and dataset library; a part of `rubric_core.store.Store`."""

    # -- rubrics --------------------------------------------------------------------------------

    def save_rubric(self, name: str, text: str) -> int:
        """Save a rubric under a name as a new version (`save_rubric_version` without a preset).

        Args:
            name: The rubric's name (surrounding whitespace is ignored).
            text: The rubric text; stored scrubbed of secrets.

        Returns:
            The new version number (1 for a new name); when ``text`` equals the latest
            version, that version's number and nothing is written.

        """
        return self.save_rubric_version(name, text)[0]

    def save_rubric_version(
        self, name: str, text: str, *, settings: RunSettings | None = None
    ) -> tuple[int, bool]:
        """Save a rubric, with the run settings preset that goes with it, as a new version.

        A version is its text and its preset together: when both equal the latest version's,
        nothing is written and that version is kept.

        Args:
            name: The rubric's name (surrounding whitespace is ignored).
            text: The rubric text; stored scrubbed of secrets.
            settings: The preset (prompt, tools, models, cap) to keep beside the text; stored
                scrubbed of secrets (`RunSettings.redacted`), with ``rubric`` set to ``text``.

        Returns:
            The version number (1 for a new name) and whether it was created (False: the
            latest version was identical and is kept).

        Raises:
            ValueError: An empty name or text, or a name holding a key (`check_name`).
            TypeError: ``settings`` is not `RunSettings`.

        """
        name = name.strip() if isinstance(name, str) else ""
        if not name:
            msg = "a rubric needs a name: give it a short non-empty name"
            raise ValueError(msg)
        check_name(name, "rubric")
        if not isinstance(text, str) or not text.strip():
            msg = f"rubric {name!r} is empty: write at least one criterion before saving"
            raise ValueError(msg)
        text = redact(text)  # a key typed (or accepted from a refiner) into it is not kept
        if settings is not None and not isinstance(settings, RunSettings):
            msg = f"settings must be RunSettings, got {type(settings).__name__}"
            raise TypeError(msg)
        preset = None if settings is None else settings.replace(rubric=text).redacted().to_json()
        now = self.now()
        with self._connect(write=True) as conn:
            conn.lock(f"rubric:{name}")  # read the latest version, then write the next one
            latest = versioned_row(conn, "rubric_versions", name, None,
                                   "version, text, settings_json")
            if latest is not None and latest["text"] == text and (
                    preset is None or latest["settings_json"] == preset):
                return int(latest["version"]), False
            version = 1 if latest is None else latest["version"] + 1
            conn.execute(
                "INSERT INTO rubrics (name, created_at, updated_at) VALUES (?, ?, ?) "
                "ON CONFLICT (name) DO UPDATE SET updated_at = excluded.updated_at",
                (name, now, now),
            )
            conn.execute(
                "INSERT INTO rubric_versions (name, version, text, created_at, settings_json) "
                "VALUES (?, ?, ?, ?, ?)",
                (name, version, text, now, preset),
            )
        return int(version), True

    def _rubric_version(self, name: str, version: int | None, column: str) -> Any:
        """One column of a saved rubric version (the latest when ``version`` is None).

        Raises:
            KeyError: No such rubric or version.

        """
        with self._connect() as conn:
            row = versioned_row(conn, "rubric_versions", name.strip(), version, column)
        if row is None:
            which = "" if version is None else f" version {version}"
            msg = f"no saved rubric {name!r}{which}"
            raise KeyError(msg)
        return row[column]

    def load_preset(self, name: str, version: int | None = None) -> RunSettings | None:
        """The run settings preset saved with a rubric version (None when it has none).

        Args:
            name: The rubric's name.
            version: A version number; the latest when None.

        Raises:
            KeyError: No such rubric or version.

        """
        raw = self._rubric_version(name, version, "settings_json")
        return None if raw is None else RunSettings.from_json(raw)

    def list_rubrics(self) -> list[dict[str, Any]]:
        """Saved rubrics by name: ``name``, ``latest_version`` and ``updated_at`` each."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT r.name, MAX(v.version) AS latest_version, r.updated_at FROM rubrics r "
                "JOIN rubric_versions v ON v.name = r.name GROUP BY r.name ORDER BY r.name"
            ).fetchall()
        return [dict(row) for row in rows]

    def load_rubric(self, name: str, version: int | None = None) -> str:
        """The text of a saved rubric.

        Args:
            name: The rubric's name.
            version: A version number; the latest when None.

        Raises:
            KeyError: No such rubric or version.

        """
        return str(self._rubric_version(name, version, "text"))

    def rubric_versions(self, name: str) -> list[dict[str, Any]]:
        """Every version of a rubric, oldest first: ``version``, ``text``, ``created_at``."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT version, text, created_at FROM rubric_versions WHERE name = ? "
                "ORDER BY version",
                (name.strip(),),
            ).fetchall()
        return [dict(row) for row in rows]

    # -- datasets -------------------------------------------------------------------------------

    def save_dataset(self, dataset: Dataset, name: str | None = None) -> int:
        """Store a checked dataset (from `rubric_core.datasets.parse_dataset`) as a new version.

        All its rows are written in one transaction, or none are; their text is scrubbed of
        secrets (`rubric_core.redact`) first.

        Args:
            dataset: The parsed dataset.
            name: Store it under this name instead of ``dataset.name``.

        Returns:
            The new version (1 for a new name); when the rows equal the latest version's, that
            version's number and nothing is written.

        """
        name = (name if name is not None else dataset.name).strip()
        if not name:
            msg = "a dataset needs a name: give it a short non-empty name"
            raise ValueError(msg)
        check_name(name, "dataset")
        if not dataset.rows:
            msg = f"dataset {name!r} has no rows"
            raise ValueError(msg)
        # Rows are stored scrubbed of secrets, like every text the store keeps. Each value is
        # scrubbed before it is written as JSON, not the JSON text after: a secret holding a
        # quote or a backslash is escaped there (so it would not be found), and a replacement
        # could swallow the backslash before a quote and leave a line that no longer parses.
        known = secret_values()

        def clean(text: str) -> str:
            return redact(text, secrets=known)

        rows = tuple(dataclasses.replace(
            row, id=clean(row.id), prompt=clean(row.prompt),
            rubric=None if row.rubric is None else clean(row.rubric),
            variables={key: clean(value) for key, value in row.variables.items()},
        ) for row in dataset.rows)
        jsonl = dataclasses.replace(dataset, rows=rows).to_jsonl()
        columns = json.dumps(list(dataset.columns), ensure_ascii=False)
        with self._connect(write=True) as conn:
            conn.lock(f"dataset:{name}")  # read the latest version, then write the next one
            latest = versioned_row(conn, "datasets", name, None, "version, jsonl, columns_json")
            if latest is not None and (latest["jsonl"], latest["columns_json"]) == (jsonl,
                                                                                      columns):
                return int(latest["version"])
            version = 1 if latest is None else int(latest["version"]) + 1
            conn.execute(
                "INSERT INTO datasets (name, version, jsonl, columns_json, row_count, "
                "created_at) VALUES (?, ?, ?, ?, ?, ?)",
                (name, version, jsonl, columns, len(dataset.rows), self.now()),
            )
        return version

    def list_datasets(self) -> list[DatasetInfo]:
        """The latest version of every stored dataset, by name."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT d.name, d.version, d.row_count, d.columns_json, d.created_at "
                "FROM datasets d WHERE d.version = (SELECT MAX(version) FROM datasets "
                "WHERE name = d.name) ORDER BY d.name"
            ).fetchall()
        return [dataset_info_from_row(row) for row in rows]

    def dataset_versions(self, name: str) -> list[DatasetInfo]:
        """Every stored version of a dataset, oldest first (empty for an unknown name)."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT name, version, row_count, columns_json, created_at FROM datasets "
                "WHERE name = ? ORDER BY version", (name.strip(),),
            ).fetchall()
        return [dataset_info_from_row(row) for row in rows]

    def load_dataset(self, name: str, version: int | None = None) -> tuple[Dataset, int]:
        """A stored dataset and its version number.

        Args:
            name: The dataset's name.
            version: A version; the latest when None.

        Raises:
            KeyError: No such dataset or version.

        """
        with self._connect() as conn:
            row = versioned_row(conn, "datasets", name.strip(), version,
                                "version, jsonl, columns_json")
        if row is None:
            which = "" if version is None else f" version {version}"
            msg = f"no stored dataset {name!r}{which}: see `rubric-studio datasets --db PATH`"
            raise KeyError(msg)
        dataset = rows_from_jsonl(row["jsonl"], name=name.strip())
        columns = tuple(json.loads(row["columns_json"]))
        return dataclasses.replace(dataset, columns=columns), int(row["version"])

    def delete_dataset(self, name: str) -> int:
        """Delete every version of a dataset that no experiment uses.

        Returns:
            How many versions were deleted (0 for an unknown name).

        Raises:
            ValueError: An experiment runs one of its versions (delete the experiment first).

        """
        with self._connect(write=True) as conn:
            used = [r["experiment_id"] for r in conn.execute(
                "SELECT experiment_id FROM experiments WHERE dataset_name = ? LIMIT 3",
                (name.strip(),))]
            if used:
                msg = (f"dataset {name!r} is used by experiment(s) "
                       f"{', '.join(u[:8] for u in used)}: delete them first")
                raise ValueError(msg)
            return int(conn.execute("DELETE FROM datasets WHERE name = ?",
                                    (name.strip(),)).rowcount)
