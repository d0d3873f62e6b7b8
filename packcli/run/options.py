"""Each stage's own options, built once per run from the run's ``PackConfig``.

The stages below the run take these small frozen objects, not the whole config: stage one (the
engines, ``tokenize.batches.ingest``) its ``TokenizeOptions``, the plan its ``PlanOptions``, the mix its
``MixOptions``, the eval split its ``HoldoutOptions``, the row builder
and the shard writers (locally, or in every Ray task) a ``RowLayout``.
"""

from __future__ import annotations

from packcli.config import PackConfig, parse_mix
from packcli.output.layout import RowLayout
from packcli.plan.holdout import HoldoutOptions
from packcli.plan.mix import MixOptions
from packcli.plan.options import PlanOptions
from packcli.tokenize.options import EncodeOptions, SplitRule, TokenizeOptions


def tokenize_options(config: PackConfig) -> TokenizeOptions:
    """Return the options of stage one (``tokenize.batches.ingest``, the engines' tokenizing)."""
    return TokenizeOptions(
        encode=encode_options(config),
        fields=dict(config.fields),
        max_len=config.max_len,
        overflow=config.overflow,
        on_error=config.on_error,
        split=split_rule(config),
        image_window=image_window(config),
        fix_turns=config.fix_turns,
        expand_turns=config.expand_turns,
        prefix_tree=config.prefix_tree,
        num_proc=config.num_proc,
        limit=config.limit,
        tokenizer=config.tokenizer_name,
        chat_template=config.chat_template,
        encoder=config.encoder,
        output=config.output,
        cache=config.cache,
        dry_run=config.dry_run,
        # A JSON dump and a hash a record (a seventh of a worker's time on chat): only for --dedup exact, now or
        # on a cache entry later.
        content_keys=(config.cache and not config.dry_run) or config.dedup == "exact",
    )


def encode_options(config: PackConfig) -> EncodeOptions:
    """Return the options that decide a sample's tokens and labels."""
    return EncodeOptions(config.train_on, config.add_eos, EncodeOptions.kwargs_items(config.template_kwargs))


def split_rule(config: PackConfig) -> SplitRule | None:
    """Return how long records are cut into pieces (``--overflow split``), or None."""
    if config.overflow != "split":
        return None
    # Pieces are cut to the most a sample may hold once padded (--pad-to-multiple-of): --max-len without it.
    return SplitRule(config.sample_limit, config.split_system, config.min_piece)


def image_window(config: PackConfig) -> tuple[int, str] | None:
    """Return (the most tokens a sample keeps, the side it is cut from) when samples may be cut, with a processor.

    Under --overflow truncate (and split, whose pieces too long on their own are cut), a sample whose
    cut would cut an image's tokens is left out instead (reason ``image_cut``).
    """
    if config.processor is None or config.overflow not in ("truncate", "split"):
        return None
    return config.sample_limit, config.cut_side


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
        balance=config.balance,
        balance_model=config.balance_model,
    )


def holdout_options(config: PackConfig) -> HoldoutOptions:
    """Return the options of the eval split (``packcli.plan.holdout``)."""
    return HoldoutOptions(
        fraction=config.eval_fraction,
        records=config.eval_records,
        overflow=config.overflow,
        sample_limit=config.sample_limit,
        seed=config.seed,
    )


def mix_options(config: PackConfig) -> MixOptions:
    """Return the options of the mix (``packcli.plan.mix``); ``config.task`` is the task found."""
    return MixOptions(
        specs=[parse_mix(v) for v in config.mix],
        plan=plan_options(config),
        by=config.mix_by,
        max_epochs=config.mix_max_epochs,
        task=config.task,
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
