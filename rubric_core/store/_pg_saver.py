"""LangGraph's ``PostgresSaver``, made to keep no secret in the values it stores inline.

``PostgresSaver`` writes a channel's value through its serializer only when it is not a
primitive: strings, numbers and booleans go into the ``checkpoints`` row's JSONB as they are,
as does the metadata. `rubric_core.redact.RedactingSerializer` never sees them, so they are
scrubbed here before ``put`` (SQLite's saver serializes the whole checkpoint, so there only the
metadata needs it: `rubric_core.redact.scrub_checkpoint_config`).
Imported only with the ``postgres`` extra installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from langgraph.checkpoint.postgres import PostgresSaver

from rubric_core.redact import redact_data, scrub_checkpoint_config, secret_values

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata


class RedactingPostgresSaver(PostgresSaver):
    """A ``PostgresSaver`` whose inline checkpoint values and metadata are scrubbed."""

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Scrub the primitives stored inline, then save as ``PostgresSaver`` does."""
        known = secret_values()
        values = {key: redact_data(value, secrets=known) if isinstance(value, str) else value
                  for key, value in checkpoint["channel_values"].items()}
        scrubbed = cast("Checkpoint", {**checkpoint, "channel_values": values})
        clean_config, clean_metadata = scrub_checkpoint_config(config, metadata)
        return super().put(cast("RunnableConfig", clean_config), scrubbed,
                           cast("CheckpointMetadata", clean_metadata), new_versions)
