"""Datasets and experiments in the store: versions, cells, one transaction each, leases.

Tests taking ``db_location`` or ``store`` (tests/conftest.py) run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
from pg_support import database_holds, scalar

from rubric_core.datasets import DatasetError, parse_dataset
from rubric_core.offline.demo_dataset import demo_dataset
from rubric_core.settings import ExperimentConfig
from rubric_core.store import SCHEMA_VERSION, Store

if TYPE_CHECKING:
    from pathlib import Path

CSV = "id,prompt,topic\na,Write about {topic},cats\nb,Write about {topic},dogs\n"


def _count(location: str | Path, table: str) -> int:
    return int(str(scalar(location, f"SELECT COUNT(*) FROM {table}")))


def test_dataset_versions_round_trip(db_location: str | Path) -> None:
    with Store(db_location) as store:
        ds = parse_dataset(CSV, name="pets")
        assert store.save_dataset(ds) == 1
        assert store.save_dataset(ds) == 1  # unchanged rows: no new version
        changed = parse_dataset(CSV.replace("dogs", "owls"), name="pets")
        assert store.save_dataset(changed) == 2
        loaded, version = store.load_dataset("pets")
        assert version == 2 and loaded.rows == changed.rows and loaded.columns == ds.columns
        assert store.load_dataset("pets", 1)[0].rows == ds.rows
        [info] = store.list_datasets()
        assert (info.name, info.version, info.row_count) == ("pets", 2, 2)
        assert [v.version for v in store.dataset_versions("pets")] == [1, 2]
        with pytest.raises(KeyError, match="no stored dataset 'nope'"):
            store.load_dataset("nope")
        assert store.delete_dataset("pets") == 2
        assert store.list_datasets() == []


def test_bad_dataset_stores_nothing(db_location: str | Path) -> None:
    path = db_location
    with Store(path) as store:
        store.list_datasets()
        with pytest.raises(DatasetError, match=r"row 3, column 'prompt'"):
            store.save_dataset(parse_dataset("id,prompt\na,hello\nb,\n", name="bad"))
    assert _count(path, "datasets") == 0


def test_experiment_cells_and_their_runs(db_location: str | Path) -> None:
    with Store(db_location) as store:
        ds = demo_dataset()
        version = store.save_dataset(ds)
        configs = (ExperimentConfig(), ExperimentConfig(max_iterations=1, label="one pass"))
        exp = store.create_experiment(name="e", dataset_name=ds.name, dataset_version=version,
                                      configurations=configs, repeats=2,
                                      row_ids=[r.id for r in ds.rows[:3]])
        assert store.get_experiment(exp.experiment_id) == exp
        assert exp.configurations == configs
        cells = store.experiment_cells(exp.experiment_id)
        assert len(cells) == 3 * 2 * 2 and len({c.thread_id for c in cells}) == 12
        assert {c.status for c in cells} == {"pending"}
        first = cells[0]
        run = store.create_run(configs[0].settings_for(ds.rows[0]), thread_id=first.thread_id)
        again = store.experiment_cells(exp.experiment_id)[0]
        assert again.run is not None and again.run.run_id == run.run_id
        assert again.status == "running"
        assert again.run.settings.dataset_row is not None
        assert again.run.settings.dataset_row["kind"] == "haiku"
        new_thread = store.renew_cell_thread(exp.experiment_id, first.key)
        renewed = store.experiment_cells(exp.experiment_id)[0]
        assert renewed.thread_id == new_thread and renewed.run is None
        with pytest.raises(ValueError, match="used by experiment"):
            store.delete_dataset(ds.name)
        store.set_experiment_status(exp.experiment_id, "finished")
        assert store.list_experiments()[0].status == "finished"
        assert store.delete_experiment(exp.experiment_id)
        assert store.experiment_cells(exp.experiment_id) == []
        assert store.get_run(run.run_id) is not None  # runs stay for Review


def test_row_without_rubric_needs_the_configuration_s() -> None:
    ds = parse_dataset(CSV, name="pets")
    with pytest.raises(ValueError, match="row 'a' has no 'rubric'"):
        ExperimentConfig().settings_for(ds.rows[0])
    settings = ExperimentConfig(rubric="- is short").settings_for(ds.rows[0])
    assert settings.rubric == "- is short" and settings.prompt == "Write about cats"
    assert settings.dataset_row == {"id": "a", "prompt": "Write about cats", "rubric": None,
                                    "topic": "cats"}


def test_schema_3_file_gains_the_experiment_tables(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite3"
    with Store(path) as store:
        run = store.create_run(prompt="p", rubric="- a")
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE experiment_cells; DROP TABLE experiments; DROP TABLE datasets;"
                       "UPDATE meta SET value = '3' WHERE key = 'schema_version';")
    conn.close()
    with Store(path) as store:
        assert store.get_run(run.run_id) == run
        assert store.save_dataset(parse_dataset(CSV, name="pets")) == 1
    conn = sqlite3.connect(path)
    (version,) = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    conn.close()
    assert version == str(SCHEMA_VERSION)


def test_stored_dataset_rows_hold_no_secret(
    db_location: str | Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rubric_core.datasets import parse_dataset

    secret = "sk-realkey-ABCDEFGHIJKLMNOP1234"
    monkeypatch.setenv("OPENAI_API_KEY", secret)
    with Store(db_location) as store:
        rows = f'prompt,note\n"my key is {secret}","Bearer abcdefgh12"\n'
        store.save_dataset(parse_dataset(rows, name="d"))
        dataset, _ = store.load_dataset("d")
    assert dataset.rows[0].prompt == "my key is [redacted]"
    assert dataset.rows[0].variables["note"] == "Bearer [redacted]"
    assert database_holds(db_location, secret) == []
    assert database_holds(db_location, "Bearer [redacted]") != []


# -- leases: several workers share an experiment's cells ------------------------------------------

ENDED = frozenset({"satisfied", "failed", "grader_error", "max_iterations_reached", "error"})


def _experiment(store: Store, rows: int = 3, configs: int = 2) -> str:
    ds = demo_dataset()
    version = store.save_dataset(ds)
    exp = store.create_experiment(
        name="e", dataset_name=ds.name, dataset_version=version,
        configurations=[ExperimentConfig(max_iterations=i + 1) for i in range(configs)],
        repeats=1, row_ids=[r.id for r in ds.rows[:rows]])
    return exp.experiment_id


def _pass(grading_run_id: str, iteration: int, result: str, **passed: bool) -> Any:
    return {"grading_run_id": grading_run_id, "iteration": iteration, "result": result,
            "status": result, "explanation": "e", "answer": "a " * 500, "duration_s": 0.1,
            "input_tokens": 10, "output_tokens": 2, "unverified": False,
            "criteria": [{"name": n, "passed": p} if p else {"name": n, "passed": p, "gap": "g"}
                         for n, p in passed.items()]}


def test_cell_outcomes_read_totals_and_the_last_grading_run(store: Store) -> None:
    exp_id = _experiment(store, rows=2, configs=2)
    cells = store.experiment_cells(exp_id)
    # Cell 0 graded twice: a first grading run of two passes, then one of two more (a retry).
    run = store.create_run(prompt="p", rubric="- a\n- b", thread_id=cells[0].thread_id)
    store.add_evaluation(run.run_id, _pass("g1", 0, "needs_revision", a=False, b=True))
    store.add_evaluation(run.run_id, _pass("g1", 1, "needs_revision", a=False, b=False))
    store.add_evaluation(run.run_id, _pass("g2", 0, "needs_revision", a=False, b=True))
    store.add_evaluation(run.run_id, _pass("g2", 1, "satisfied", a=True, b=True))
    store.finish_run(run.run_id, "satisfied", duration_s=2.5)
    # Cell 2 started but has not graded yet; cells 1 and 3 are pending.
    started = store.create_run(prompt="p", rubric="- a", thread_id=cells[2].thread_id)

    lean = store.cell_outcomes(exp_id)
    assert [c.key for c in lean] == [c.key for c in cells]
    assert [c.status for c in lean] == ["satisfied", "pending", "running", "pending"]
    assert [c.run_id for c in lean] == [run.run_id, None, started.run_id, None]
    first = lean[0]
    assert (first.iterations, first.input_tokens, first.output_tokens, first.duration_s) == (
        4, 40, 8, 2.5)
    assert all(c.passes == () for c in lean)

    full = store.cell_outcomes(exp_id, verdicts=True)
    assert [c.key for c in full] == [c.key for c in cells]
    assert [r for r, _ in full[0].passes] == ["needs_revision", "satisfied"]  # g2 only
    assert [[(v["name"], v["passed"]) for v in verdicts] for _, verdicts in full[0].passes] == [
        [("a", False), ("b", True)], [("a", True), ("b", True)]]
    assert [c.passes for c in full[1:]] == [(), (), ()]
    assert [c._replace(passes=()) for c in full] == lean


def test_experiment_cells_are_read_a_page_at_a_time(store: Store) -> None:
    exp_id = _experiment(store, rows=3, configs=2)
    every = store.experiment_cells(exp_id)
    pages = [store.experiment_cells(exp_id, offset=start, limit=4) for start in (0, 4, 8)]
    assert [len(p) for p in pages] == [4, 2, 0]
    assert [c for p in pages for c in p] == every


def test_claims_hand_out_each_unfinished_cell_once_in_run_order(store: Store) -> None:
    exp_id = _experiment(store)
    cells = store.experiment_cells(exp_id)
    # A cell whose run ended is done; a running or interrupted one still needs its worker.
    ended = store.create_run(prompt="p", rubric="- a", thread_id=cells[1].thread_id)
    store.finish_run(ended.run_id, "satisfied")
    stopped = store.create_run(prompt="p", rubric="- a", thread_id=cells[2].thread_id)
    store.finish_run(stopped.run_id, "interrupted")
    claimed = []
    while (cell := store.claim_cell(exp_id, "w1", lease_s=600, done=ENDED)) is not None:
        assert cell.lease_owner == "w1" and cell.lease_expires_at is not None
        claimed.append(cell.key)
    assert claimed == [c.key for c in cells if c.key != cells[1].key]
    assert store.claim_cell(exp_id, "w2", lease_s=600, done=ENDED) is None
    assert {c.lease_owner for c in store.experiment_cells(exp_id)} == {"w1", None}
    # With errors retried, an errored cell is claimable; `done` is the caller's vocabulary.
    store.finish_run(ended.run_id, "error")
    again = store.claim_cell(exp_id, "w2", lease_s=600, done=ENDED - {"error"})
    assert again is not None and again.key == cells[1].key and again.status == "error"


def test_a_live_lease_is_kept_an_expired_one_is_reclaimable(store: Store) -> None:
    exp_id = _experiment(store, rows=1, configs=2)
    first = store.claim_cell(exp_id, "alive", lease_s=600, done=ENDED)
    short = store.claim_cell(exp_id, "dies", lease_s=0.001, done=ENDED)
    assert first is not None and short is not None and first.key != short.key
    time.sleep(0.05)  # the dying worker's lease runs out (by the database's clock)
    taken = store.claim_cell(exp_id, "heir", lease_s=600, done=ENDED)
    assert taken is not None and taken.key == short.key  # never the live one
    assert store.claim_cell(exp_id, "heir", lease_s=600, done=ENDED) is None
    assert not store.renew_lease(exp_id, short.key, "dies", lease_s=600)  # it lost the cell
    assert not store.release_cell(exp_id, short.key, "dies")
    assert store.renew_lease(exp_id, first.key, "alive", lease_s=600)
    assert store.release_cell(exp_id, first.key, "alive")
    released = store.claim_cell(exp_id, "heir", lease_s=600, done=ENDED)
    assert released is not None and released.key == first.key


def test_an_experiment_with_a_live_lease_is_not_deleted(store: Store) -> None:
    exp_id = _experiment(store, rows=1, configs=2)
    held = store.claim_cell(exp_id, "worker", lease_s=600, done=ENDED)
    dying = store.claim_cell(exp_id, "dies", lease_s=0.001, done=ENDED)
    assert held is not None and dying is not None
    time.sleep(0.05)  # the dying worker's lease has run out; the other one's has not
    with pytest.raises(ValueError, match=r"is running: 1 cell\(s\) are leased .* 600 s more"):
        store.delete_experiment(exp_id)
    assert len(store.experiment_cells(exp_id)) == 2  # nothing was deleted
    assert store.release_cell(exp_id, held.key, "worker")
    assert store.delete_experiment(exp_id)
    assert store.get_experiment(exp_id) is None and store.experiment_cells(exp_id) == []
    assert not store.delete_experiment(exp_id)


def test_a_claim_can_be_kept_to_some_cells(store: Store) -> None:
    exp_id = _experiment(store)
    keys = [c.key for c in store.experiment_cells(exp_id)]
    got = store.claim_cell(exp_id, "w", lease_s=60, done=ENDED, keys=[keys[4], keys[2]])
    assert got is not None and got.key == keys[2]  # in run order among those allowed
    got = store.claim_cell(exp_id, "w", lease_s=60, done=ENDED, keys=[keys[4], keys[2]])
    assert got is not None and got.key == keys[4]
    assert store.claim_cell(exp_id, "w", lease_s=60, done=ENDED, keys=[keys[2]]) is None
    assert store.claim_cell(exp_id, "w", lease_s=60, done=ENDED, keys=[]) is None


@pytest.mark.parametrize(
    ("owner", "lease_s"),
    [pytest.param("", 5, id="empty_owner"), pytest.param("w", 0, id="zero_lease"),
     pytest.param("w", True, id="bool_lease")],
)
def test_claim_rejects_bad_arguments(store: Store, owner: str, lease_s: float) -> None:
    exp_id = _experiment(store, rows=1, configs=1)
    with pytest.raises(ValueError):
        store.claim_cell(exp_id, owner, lease_s=lease_s, done=ENDED)


def test_workers_claiming_at_once_never_share_a_cell(db_location: str | Path) -> None:
    with Store(db_location) as store:
        exp_id = _experiment(store, rows=10, configs=3)
    workers = 4
    barrier = threading.Barrier(workers)
    claims: dict[str, list[tuple[str, int, int]]] = {}
    errors: list[BaseException] = []

    def work(owner: str) -> None:
        mine = claims.setdefault(owner, [])
        try:
            with Store(db_location) as own:  # its own connections, as another process has
                barrier.wait(timeout=10)
                while (cell := own.claim_cell(exp_id, owner, lease_s=600,
                                              done=ENDED)) is not None:
                    mine.append(cell.key)
        except BaseException as exc:  # collected: pytest does not see thread exceptions
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    every = [key for mine in claims.values() for key in mine]
    assert len(every) == len(set(every)) == 30  # each cell once, none lost
    with Store(db_location) as store:
        owners = {c.key: c.lease_owner for c in store.experiment_cells(exp_id)}
    assert all(owners[key] == owner for owner, mine in claims.items() for key in mine)


def test_leased_elsewhere_counts_other_workers_live_leases(store: Store) -> None:
    exp_id = _experiment(store, rows=2, configs=1)
    mine = store.claim_cell(exp_id, "me", lease_s=600, done=ENDED)
    theirs = store.claim_cell(exp_id, "them", lease_s=600, done=ENDED)
    assert mine is not None and theirs is not None
    assert store.leased_elsewhere(exp_id, "me") == 1
    assert store.release_cell(exp_id, theirs.key, "them")
    assert store.leased_elsewhere(exp_id, "me") == 0
    assert store.leased_elsewhere(exp_id, "them") == 1


def test_a_retried_cells_earlier_run_is_kept_with_its_experiment(store: Store) -> None:
    from rubric_core import session
    from rubric_core.experiments import create_experiment, retry_cell

    config = ExperimentConfig(rubric="- The answer is about a pet")
    experiment = create_experiment(store, parse_dataset(CSV, name="pets"), [config])
    first, pending = store.experiment_cells(experiment.experiment_id)
    row = store.load_dataset("pets")[0].rows[0]
    run = session.start(store, config.settings_for(row), thread_id=first.thread_id)
    for _ in run:
        pass
    assert store.earlier_cell_runs(experiment.experiment_id) == []  # it is the cell's run
    thread = retry_cell(store, experiment.experiment_id, first.key)
    # The other cell has no run yet: that must not hide the earlier run (a NULL in NOT IN).
    [earlier] = store.earlier_cell_runs(experiment.experiment_id)
    assert (earlier.run_id, earlier.row_id, earlier.config_index, earlier.repeat_index) == (
        run.run_id, "a", 0, 0)
    assert earlier.iterations >= 1
    assert store.experiment_cells(experiment.experiment_id)[0].thread_id == thread
    assert pending.run is None
    assert set(store.experiment_call_usage(experiment.experiment_id)) == {run.run_id}
    with pytest.raises(KeyError, match="no cell"):
        retry_cell(store, experiment.experiment_id, ("zz", 0, 0))
    assert store.delete_experiment(experiment.experiment_id)
    assert store.earlier_cell_runs(experiment.experiment_id) == []
