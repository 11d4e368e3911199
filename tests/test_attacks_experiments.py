"""Attacks on experiments through the real CLI: keys in ids, headers and configuration files.

Each was a hole (#23, holes 4 to 6): a key reached the database or an export, or ``eval`` ended
in a traceback. Keys are key-shaped strings, and the configured ``OPENAI_API_KEY`` value.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[1])
KEY = "sk-proj-" + "Zq7Xw2Lm" * 5
ENV_KEY = "envsecretvalue-4d1f9a27c3"  # not key-shaped: found only as the configured value


def _eval(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": ROOT, "OPENAI_API_KEY": ENV_KEY}
    return subprocess.run([sys.executable, "-m", "rubric_core", "eval", *args, "--db",
                           str(tmp_path / "db.sqlite3")], env=env, capture_output=True,
                          text=True, timeout=120, check=False, cwd=tmp_path)


def _stored_bytes(tmp_path: Path) -> bytes:
    return b"".join(p.read_bytes() for p in tmp_path.glob("db.sqlite3*"))


@pytest.mark.parametrize(("csv_text", "expected"), [
    pytest.param(f"id,prompt\n{KEY},Write a haiku about spring\n",
                 "row 2, column 'id': the id holds an API key", id="key_in_the_id_column"),
    pytest.param(f"prompt,{KEY}\nWrite a haiku about spring,x\n",
                 "row 1, column 2: the column name holds an API key", id="key_as_a_header"),
])
def test_a_key_shaped_id_or_header_is_refused_before_anything_is_stored(
    tmp_path: Path, csv_text: str, expected: str
) -> None:
    (tmp_path / "d.csv").write_text(csv_text, encoding="utf-8")
    proc = _eval(tmp_path, "--dataset", "d.csv", "--rubric", "- Has three lines",
                 "--csv", "out.csv")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    assert KEY.encode() not in _stored_bytes(tmp_path)
    assert not (tmp_path / "out.csv").exists()


def test_keys_in_configuration_files_are_never_stored_or_exported(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_text("id,prompt\n1,Write a haiku about spring\n",
                                    encoding="utf-8")
    (tmp_path / "rubric.txt").write_text(f"- Has three lines\n- Mentions {KEY} or {ENV_KEY}\n",
                                         encoding="utf-8")
    (tmp_path / "system.txt").write_text(f"You are a poet. Use {ENV_KEY} and {KEY}.\n",
                                         encoding="utf-8")
    proc = _eval(tmp_path, "--dataset", "d.csv", "--config",
                 "worker=demo,grader=rules,rubric=@rubric.txt,system=@system.txt",
                 "--csv", "out.csv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stored = _stored_bytes(tmp_path)
    exported = (tmp_path / "out.csv").read_bytes()
    for secret in (KEY, ENV_KEY):
        assert secret.encode() not in stored
        assert secret.encode() not in exported
        assert secret not in proc.stdout + proc.stderr
    assert b"[redacted]" in stored  # scrubbed, not dropped: the rubric keeps its criteria


def test_a_key_given_as_a_priced_model_is_refused_and_never_stored(tmp_path: Path) -> None:
    # Attack: the budget and its prices are stored with the experiment; a model name holding a
    # key went into experiments.budget_json as typed.
    (tmp_path / "d.csv").write_text("prompt\nWrite a haiku about spring\n", encoding="utf-8")
    proc = _eval(tmp_path, "--dataset", "d.csv", "--rubric", "- The poem has three lines",
                 "--price", f"{KEY}=1,1,1", "--max-cost", "5")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "holds an API key" in proc.stderr and KEY not in proc.stdout + proc.stderr
    assert KEY.encode() not in _stored_bytes(tmp_path)
