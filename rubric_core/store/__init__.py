"""The Rubric Studio database: SQLite (the embedded default) or PostgreSQL, one interface.

`Store` is the only thing that knows which database it talks to: a SQLite file path, or a
``postgresql://`` URL (``RUBRIC_STUDIO_DB`` or ``--db``). It holds LangGraph's checkpoints
(through the saver :meth:`Store.saver` returns; a run's writes are stored only while its owner
holds it: `Fence`) and our own tables, under one versioned schema (`SCHEMA_VERSION`) that is
upgraded in place; a database that is not ours is refused and left untouched. `copy_store`
copies everything from one database to another, either way.

`Store` is composed of one part per area (`rubric_core.store._store`); what it reads comes back
as the records of `rubric_core.store._records`.
"""

from rubric_core.store._copy import copy_store
from rubric_core.store._core import default_db_path, shown_location
from rubric_core.store._fence import Fence
from rubric_core.store._labels import check_label_text
from rubric_core.store._pairwise import PairwiseItem, PairwiseRecord
from rubric_core.store._pg_url import is_url, mask_url
from rubric_core.store._records import (
    AnswerItem,
    AnswerSetInfo,
    CallUsage,
    CellOutcome,
    CellRecord,
    DatasetInfo,
    EarlierRun,
    ExperimentRecord,
    ItemLabel,
    PassVerdicts,
    RegradeJob,
    RegradeResult,
    RunRecord,
)
from rubric_core.store._runs import RunTakenOver, ThreadTaken
from rubric_core.store._schema import (
    APP_ID,
    DB_ENV_VAR,
    SCHEMA_VERSION,
    StoreError,
    StoreUnavailable,
    is_unavailable,
)
from rubric_core.store._sqlite import APPLICATION_ID
from rubric_core.store._store import Store
from rubric_core.types import LABEL_NOTE_CHAR_LIMIT, RUN_STATUSES

__all__ = [
    "APPLICATION_ID",
    "APP_ID",
    "DB_ENV_VAR",
    "LABEL_NOTE_CHAR_LIMIT",
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "AnswerItem",
    "AnswerSetInfo",
    "CallUsage",
    "CellOutcome",
    "CellRecord",
    "DatasetInfo",
    "EarlierRun",
    "ExperimentRecord",
    "Fence",
    "ItemLabel",
    "PairwiseItem",
    "PairwiseRecord",
    "PassVerdicts",
    "RegradeJob",
    "RegradeResult",
    "RunRecord",
    "RunTakenOver",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "ThreadTaken",
    "check_label_text",
    "copy_store",
    "default_db_path",
    "is_unavailable",
    "is_url",
    "mask_url",
    "shown_location",
]
