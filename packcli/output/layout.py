"""How the packed rows are laid out and written: the options of the row builder and the shard writers.

A run builds one ``RowLayout`` once the token store is there (the pad id is the tokenizer's, the task
the inputs'), and passes it to the writers, locally or in every Ray task, instead of the whole config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from packcli.contract import IMAGE_SHARD_COLUMNS, TREE_COLUMNS, shard_columns, shard_schema


@dataclass(frozen=True)
class RowLayout:
    """The options that decide a shard's rows and files: lengths, padding, optional columns, format."""

    max_len: int
    pad_id: int = 0
    pad_to_max: bool = False  # every row padded to max_len with one padding segment
    pad_multiple: int = 1  # every sample padded to a multiple of this (packing.pad_lengths)
    pad_offset: int = 0  # 1 for Megatron's layout (a sample of n tokens runs as n - 1)
    loss_weighting: str = "token"  # token: no loss_weights column; sample or sqrt: 1/n or 1/sqrt(n)
    sample_roles: bool = False  # preference or KTO data: a sample_role column
    sources: bool = False  # --mix: a source column (packcli.plan.mix)
    output_format: str = "parquet"
    rows_per_shard: int = 2048
    output: str = ""  # the output as the user named it, for error messages
    images: bool = False  # --processor: the image columns (packcli.output.images)
    image_bytes: bool = False  # with them, image_bytes (--embed-images, or images that came as bytes)
    embed_images: bool = False  # --embed-images: the bytes of images given by path too
    image_spans: bool = False  # with them, image_spans (a family whose image is more than its image tokens)
    trees: bool = False  # --prefix-tree: the tree columns, and position_ids that follow the trees

    @property
    def pad_to(self) -> int | None:
        """The length every row is padded to (``--pad-to-max``), or None."""
        return self.max_len if self.pad_to_max else None

    def optional_columns(self) -> list[str]:
        """The optional columns (``contract.OPTIONAL_SHARD_COLUMNS``) this layout asks for, in their order."""
        optional = []
        if self.pad_multiple > 1:
            optional.append("seq_lengths_unpadded")
        if self.loss_weighting != "token":
            optional.append("loss_weights")
        if self.sample_roles:
            optional.append("sample_role")
        if self.sources:
            optional.append("source")
        if self.trees:
            optional.extend(TREE_COLUMNS)
        return optional

    def schema(self) -> Any:
        """The columns the rows have: SHARD_SCHEMA and the optional columns this layout asks for."""
        schema = shard_schema(self.optional_columns())
        if self.images:
            from packcli.output.images import image_fields

            for f in image_fields(self.image_bytes, self.image_spans):
                schema = schema.append(f)
        return schema

    def columns(self) -> list[str]:
        """The names of ``schema()``'s columns, in order, without pyarrow (the manifest lists them)."""
        names = shard_columns(self.optional_columns())
        if self.images:
            from packcli.output.images import written

            names += [name for name, _ in IMAGE_SHARD_COLUMNS if written(name, self.image_bytes, self.image_spans)]
        return names
