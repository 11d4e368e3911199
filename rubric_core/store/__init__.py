"""The Rubric Studio database: see `rubric_core.store._core`."""

from rubric_core.store._core import (
    APP_ID,
    APPLICATION_ID,
    DB_ENV_VAR,
    RUN_STATUSES,
    SCHEMA_VERSION,
    CellRecord,
    DatasetInfo,
    ExperimentRecord,
    RunRecord,
    Store,
    StoreError,
    default_db_path,
)

__all__ = [
    "APPLICATION_ID", "APP_ID", "DB_ENV_VAR", "RUN_STATUSES", "SCHEMA_VERSION", "CellRecord",
    "DatasetInfo", "ExperimentRecord", "RunRecord", "Store", "StoreError", "default_db_path",
]
