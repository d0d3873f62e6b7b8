"""Each stage's own options, built once per run from the run's ``PackConfig``.

The stages below the run take these small frozen objects, not the whole config: the plan its
``PlanOptions``, the row builder and the shard writers (locally, or in every Ray task) a ``RowLayout``.
"""

from __future__ import annotations

from packcli.config import PackConfig
from packcli.output.layout import RowLayout
from packcli.plan.options import PlanOptions


def plan_options(config: PackConfig) -> PlanOptions:
    """Return the options of the plan (``packcli.plan.planner.make_plan``)."""
    return PlanOptions(
        max_len=config.max_len,
        sample_limit=config.sample_limit,
        overflow=config.overflow,
        cut_side=config.cut_side,
        pad_multiple=config.pad_multiple,
        pad_offset=config.pad_offset,
        algorithm=config.algorithm,
        seed=config.seed,
        world_size=config.world_size,
        rank_remainder=config.rank_remainder,
    )


def row_layout(config: PackConfig, pad_id: int, embedded_images: int = 0, image_spans: bool = False) -> RowLayout:
    """Return how the rows are built and written; ``config.task`` is the task found (never ``auto``).

    ``embedded_images``: the images of the token store that came as bytes (they need ``image_bytes``);
    ``image_spans``: the processor's family expands an image into more than its image tokens.
    """
    return RowLayout(
        max_len=config.max_len,
        pad_id=pad_id,
        pad_to_max=config.pad_to_max,
        pad_multiple=config.pad_multiple,
        pad_offset=config.pad_offset,
        loss_weighting=config.loss_weighting,
        sample_roles=config.task in ("preference", "kto"),
        sources=bool(config.mix),
        output_format=config.output_format,
        rows_per_shard=config.rows_per_shard,
        output=config.output,
        images=config.processor is not None,
        image_bytes=config.processor is not None and (config.embed_images or embedded_images > 0),
        embed_images=config.embed_images,
        image_spans=config.processor is not None and image_spans,
        trees=config.prefix_tree,
    )
