"""The frozen options of a pack run, declared once: their types, defaults, choices and rules.

``PackConfig``'s fields are the options (a preset's keys and ``packcli.pack``'s keywords), each declared
once with ``option()`` (``packcli.config.declare``): its name, type and default, and what the command
line shows of it (help, flag, metavar), from which ``packcli pack``'s parameters are built. Their choices
are the Literal types of ``CHOICE_TYPES``; ``option_problem`` is the rule of one value, applied alike to
flags, presets and the library's calls. Presets are read by ``packcli.config.presets``.

The package's modules: ``choices`` (the Literal types), ``declare`` (how an option is declared, its help
panel and concern), ``values`` (the kinds, ranges and formats of values), ``pack_config`` (``PackConfig``
and the rule of each value), ``rules`` (the rules between options), ``terms`` (how messages name
options) and ``presets``. Their names are re-exported here, where the package's users import them.
"""

from __future__ import annotations

from packcli.config.choices import (
    CHOICE_TYPES as CHOICE_TYPES,
    CHOICES as CHOICES,
    Algorithm as Algorithm,
    Balance as Balance,
    Dedup as Dedup,
    EncoderMode as EncoderMode,
    EngineName as EngineName,
    ExpandTurns as ExpandTurns,
    LossWeighting as LossWeighting,
    MixBy as MixBy,
    OnError as OnError,
    OutputFormat as OutputFormat,
    Overflow as Overflow,
    RankRemainder as RankRemainder,
    RecordFormat as RecordFormat,
    SplitSystem as SplitSystem,
    Task as Task,
    TrainOn as TrainOn,
    TruncateSide as TruncateSide,
)
from packcli.config.declare import (
    HELP_PANELS as HELP_PANELS,
    OPTION_GROUPS as OPTION_GROUPS,
    Declared as Declared,
    declared as declared,
    option as option,
    table_option as table_option,
)
from packcli.config.pack_config import (
    BUILTIN_TEMPLATES as BUILTIN_TEMPLATES,
    DECLARATIONS as DECLARATIONS,
    OPTION_TYPES as OPTION_TYPES,
    PAD_TO_MAX_LIMIT as PAD_TO_MAX_LIMIT,
    PADDED_ROW_BYTES_PER_TOKEN as PADDED_ROW_BYTES_PER_TOKEN,
    PackConfig as PackConfig,
    declared_type as declared_type,
    option_default as option_default,
    option_problem as option_problem,
)
from packcli.config.terms import Hint as Hint, flag as flag, flag_term as flag_term, suggest as suggest
from packcli.config.values import (
    CALL_OPTIONS as CALL_OPTIONS,
    EVAL_OPTIONS as EVAL_OPTIONS,
    EXPAND_TURNS_CONFLICTS as EXPAND_TURNS_CONFLICTS,
    EXPECTED as EXPECTED,
    MIX_SUM_TOLERANCE as MIX_SUM_TOLERANCE,
    NOT_EMPTY as NOT_EMPTY,
    NOT_WITH_IMAGES as NOT_WITH_IMAGES,
    PREFIX_TREE_CONFLICTS as PREFIX_TREE_CONFLICTS,
    RANGES as RANGES,
    check_eval as check_eval,
    describe_value as describe_value,
    did_you_mean as did_you_mean,
    has_type as has_type,
    number as number,
    parse_mix as parse_mix,
)
