"""Benchmark ``packcli pack`` against the tokenizer's own limit and a TRL ``pack_dataset`` pipeline.

One run measures, on the same JSONL chat file and side by side:

  limit     render every conversation with the chat template packcli uses for the default tokenizer,
            then one batched fast-tokenizer call over all texts (the tokenizer's own cost);
  trl       datasets.load_dataset("json") -> map(apply_chat_template(..., return_assistant_tokens_mask=True),
            num_proc) -> labels from the assistant mask -> drop samples longer than --max-len ->
            trl.pack_dataset(strategy="bfd") -> to_parquet, with a fresh datasets cache;
  packcli   ``python -m packcli pack`` end to end: without the cache, with a cold and then a warm cache
            (second run with another --seed), and without the cache on four copies of the data.

Every run is a separate process, timed with the wall clock; peak memory is the maximum resident set of
any one process of the run (``/usr/bin/time -v``, else getrusage of a wrapper) and, where psutil is
installed, the peak sum of PSS over the run's process tree sampled every 0.2 s (workers included).
CPU seconds are user + system time of all the run's processes: on a shared machine, tokens per
CPU-second compare better than tokens per second. Both use the corpus's tokens (every conversation
rendered and encoded, before the ones over --max-len are dropped) as the numerator.

The table is printed and written to WORKDIR/bench_results.json and WORKDIR/bench_results.md.

    python benchmarks/bench_pipeline.py --data benchmarks/data/chat.jsonl
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TIME_BIN = "/usr/bin/time"
SAMPLE_SECONDS = 0.2
CHUNK = 1024  # texts per encode_batch call in the chunked form of the ceiling


# -- stages that run in their own process ------------------------------------------------------------


def stage_limit(data: Path, max_len: int, out: Path) -> None:
    """Render + one batched encode over every conversation; write timings and token counts."""
    import numpy as np
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from packcli.tokenize.encoders.tokenizer import load_tokenizer
    from packcli.tokenize.templates.choice import chatml_template

    tokenizer = load_tokenizer(None)
    template = _compile_jinja_template(chatml_template())
    special = dict(tokenizer.special_tokens_map)

    t0, c0 = time.perf_counter(), time.process_time()
    with open(data, encoding="utf-8") as f:
        conversations = [json.loads(line)["messages"] for line in f if line.strip()]
    t1, c1 = time.perf_counter(), time.process_time()
    texts = [template.render(messages=m, add_generation_prompt=False, **special) for m in conversations]
    t2, c2 = time.perf_counter(), time.process_time()
    del conversations
    encoded = tokenizer(texts, add_special_tokens=False)
    t3, c3 = time.perf_counter(), time.process_time()
    lengths = np.array([len(x) for x in encoded["input_ids"]], dtype=np.int64)
    del encoded
    # The call packcli makes: Encoding objects with offsets, no conversion to Python lists.
    t4, c4 = time.perf_counter(), time.process_time()
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    t5, c5 = time.perf_counter(), time.process_time()
    del encodings
    # The same call in chunks of CHUNK texts (still on all cores): one call over a whole large corpus
    # holds every Encoding at once and is slower than chunks, so the ceiling takes the faster of the two.
    for i in range(0, len(texts), CHUNK):
        tokenizer.backend_tokenizer.encode_batch(texts[i : i + CHUNK], add_special_tokens=False)
    t6, c6 = time.perf_counter(), time.process_time()
    kept = lengths[lengths <= max_len]
    result = {
        "conversations": len(texts),
        "characters": sum(map(len, texts)),
        "tokens": int(lengths.sum()),
        "tokens_kept": int(kept.sum()),
        "samples_kept": len(kept),
        "median_tokens": float(np.median(lengths)),
        "mean_tokens": float(lengths.mean()),
        "p90_tokens": float(np.percentile(lengths, 90)),
        "p99_tokens": float(np.percentile(lengths, 99)),
        "max_tokens": int(lengths.max()),
        "over_max_len": int((lengths > max_len).sum()),
        "over_8k": int((lengths > 8192).sum()),
        "seconds": {
            "parse_json": t1 - t0,
            "render": t2 - t1,
            "encode": t3 - t2,
            "render_encode": t3 - t1,
            "encode_batch_offsets": t5 - t4,
            "encode_batch_chunked": t6 - t5,
        },
        "cpu_seconds": {
            "parse_json": c1 - c0,
            "render": c2 - c1,
            "encode": c3 - c2,
            "render_encode": c3 - c1,
            "encode_batch_offsets": c5 - c4,
            "encode_batch_chunked": c6 - c5,
        },
    }
    out.write_text(json.dumps(result, indent=2))


def stage_serial(data: Path, out: Path) -> None:
    """Render + encode every conversation on one thread (the tokenizer's thread pool off): CPU seconds.

    Divided by the cores, this is what perfectly parallel one-thread workers (packcli's layout) would
    take for the tokenizer's own work; the table shows it beside the ceiling, since which of the two is
    lower depends on the machine and its load.
    """
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from packcli.tokenize.encoders.tokenizer import load_tokenizer
    from packcli.tokenize.templates.choice import chatml_template

    tokenizer = load_tokenizer(None)
    template = _compile_jinja_template(chatml_template())
    special = dict(tokenizer.special_tokens_map)
    with open(data, encoding="utf-8") as f:
        conversations = [json.loads(line)["messages"] for line in f if line.strip()]
    c0 = time.process_time()
    texts = [template.render(messages=m, add_generation_prompt=False, **special) for m in conversations]
    c1 = time.process_time()
    tokens = 0
    for i in range(0, len(texts), CHUNK):
        tokens += sum(
            len(e) for e in tokenizer.backend_tokenizer.encode_batch(texts[i : i + CHUNK], add_special_tokens=False)
        )
    c2 = time.process_time()
    out.write_text(json.dumps({"tokens": tokens, "cpu_seconds": {"render": c1 - c0, "encode": c2 - c1}}))


def stage_trl(data: Path, max_len: int, num_proc: int, workdir: Path, out: Path) -> None:
    """The TRL path with a fresh datasets cache; write timings, rows and fill."""
    t_start = time.perf_counter()
    import datasets
    import pyarrow.compute as pc
    import trl
    from trl import pack_dataset

    from packcli.tokenize.encoders.tokenizer import load_tokenizer
    from packcli.tokenize.templates.choice import chatml_template

    datasets.disable_progress_bars()
    tokenizer = load_tokenizer(None)
    template = chatml_template()
    cache = Path(os.environ["HF_DATASETS_CACHE"])
    t_import = time.perf_counter()

    ds = datasets.load_dataset("json", data_files=str(data), split="train", cache_dir=str(cache))
    t_load = time.perf_counter()

    def tokenize(example: dict[str, Any]) -> dict[str, Any]:
        enc = tokenizer.apply_chat_template(
            example["messages"],
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=True,
            chat_template=template,
        )
        ids = enc["input_ids"]
        labels = [t if m else -100 for t, m in zip(ids, enc["assistant_masks"], strict=True)]
        return {"input_ids": ids, "labels": labels, "length": len(ids)}

    ds = ds.map(tokenize, remove_columns=ds.column_names, num_proc=num_proc)
    t_map = time.perf_counter()
    ds = ds.filter(lambda n: [x <= max_len for x in n], input_columns="length", batched=True, num_proc=num_proc)
    ds = ds.remove_columns("length")
    samples = len(ds)
    t_filter = time.perf_counter()
    # As SFTTrainer calls it: the map keyword arguments carry num_proc.
    packed = pack_dataset(ds, seq_length=max_len, strategy="bfd", map_kwargs={"num_proc": num_proc})
    t_pack = time.perf_counter()
    out_dir = workdir / "trl_out"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    packed.to_parquet(str(out_dir / "packed.parquet"))
    t_write = time.perf_counter()
    seq_lengths = packed.data.column("seq_lengths")
    tokens = int(pc.sum(pc.list_flatten(seq_lengths)).as_py())
    rows = len(packed)
    result = {
        "trl_version": trl.__version__,
        "datasets_version": datasets.__version__,
        "rows": rows,
        "samples": samples,
        "tokens": tokens,
        "fill": tokens / (rows * max_len) if rows else 0.0,
        "seconds": {
            "import_and_load_tokenizer": t_import - t_start,
            "load_dataset": t_load - t_import,
            "map_tokenize": t_map - t_load,
            "filter": t_filter - t_map,
            "pack_dataset": t_pack - t_filter,
            "to_parquet": t_write - t_pack,
            "in_process": t_write - t_start,
        },
    }
    out.write_text(json.dumps(result, indent=2))


# -- the driver --------------------------------------------------------------------------------------


class TreeSampler:
    """Sample the summed RSS and PSS of a process tree until stopped; keep the peaks (bytes)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_rss = 0
        self.peak_pss = 0
        self.cpu: dict[int, float] = {}  # last user + system seconds seen, by pid
        self.ok = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeSampler:
        try:
            import psutil  # noqa: F401
        except ImportError:
            return self
        self.ok = True
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.ok:
            self._thread.join()

    def _run(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            rss = pss = 0
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                break
            for p in procs:
                try:
                    info = p.memory_full_info()
                    times = p.cpu_times()
                except psutil.Error:
                    continue
                self.cpu[p.pid] = times.user + times.system
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            self.peak_rss = max(self.peak_rss, rss)
            self.peak_pss = max(self.peak_pss, pss)
            self._stop.wait(SAMPLE_SECONDS)


_WRAPPER = (
    "import resource, subprocess, sys\n"
    "rc = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(rc)\n"
)


def measure(name: str, cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd`` as a fresh process tree; return wall seconds, peak memory, stdout and stderr."""
    rss_file = workdir / f".{name}.rss"
    rss_file.unlink(missing_ok=True)
    if os.path.exists(TIME_BIN):
        full = [TIME_BIN, "-v", "-o", str(rss_file), *cmd]
        rss_source = "/usr/bin/time -v"
    else:
        full = [sys.executable, "-c", _WRAPPER, str(rss_file), *cmd]
        rss_source = "getrusage(RUSAGE_CHILDREN) of a wrapper"
    run_env = {**os.environ, **(env or {})}
    run_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), run_env.get("PYTHONPATH")]))
    print(f"[bench] {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    proc = subprocess.Popen(full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=run_env, cwd=REPO, text=True)
    with TreeSampler(proc.pid) as sampler:
        stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"[bench] {name} failed with exit code {proc.returncode}")
    text = rss_file.read_text() if rss_file.exists() else ""
    match = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    kbytes = int(match.group(1)) if match else int(text.strip() or 0)
    cpu = None
    if match:
        user = re.search(r"User time \(seconds\): ([\d.]+)", text)
        system = re.search(r"System time \(seconds\): ([\d.]+)", text)
        cpu = float(user.group(1)) + float(system.group(1)) if user and system else None
    rss_file.unlink(missing_ok=True)
    result = {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "peak_rss_mb": kbytes / 1024,
        "peak_rss_source": rss_source,
        "tree_peak_pss_mb": sampler.peak_pss / 2**20 if sampler.ok else None,
        "tree_peak_rss_mb": sampler.peak_rss / 2**20 if sampler.ok else None,
        "tree_cpu_seconds_sampled": sum(sampler.cpu.values()) if sampler.ok else None,
        "stdout": stdout,
    }
    print(
        f"[bench] {name}: {seconds:.1f} s wall, {_fmt(cpu, '.1f')} s CPU, peak RSS {kbytes / 1024:.0f} MB",
        file=sys.stderr,
        flush=True,
    )
    return result


def packcli_run(
    name: str, data: Path, args: argparse.Namespace, workdir: Path, extra: list[str], tokens: int
) -> dict[str, Any]:
    out = workdir / f"out_{name}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "packcli", "pack", str(data), "--max-len", str(args.max_len)]
    # The ceilings render with ChatML: packcli must too (the default tokenizer's default is another template).
    cmd += ["--chat-template", "chatml"]
    cmd += ["--num-proc", str(args.num_proc), *extra, "-o", str(out), "--quiet", "--json"]
    code = code_identity()["packcli_sources_sha256"]
    run = measure(name, cmd, workdir)
    summary = json.loads(run.pop("stdout"))
    shutil.rmtree(out, ignore_errors=True)
    return {
        **run,
        "command": " ".join(["python", *cmd[1:]]),
        "tokens_per_second": tokens / run["seconds"],
        "rows": summary["rows"],
        "fill": summary["fill"],
        "packed": summary["packed"],
        "tokens": summary["tokens"],
        "trainable_tokens": summary["trainable_tokens"],
        "lower_bound_l2": summary.get("lower_bound_l2"),
        "cache": summary["cache"],
        "inner_seconds": summary.get("seconds"),
        "packcli_sources_sha256": code,
        "stage_seconds": summary.get("stage_seconds"),
    }


def trl_stage(name: str, me: list[str], common: list[str], workdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the TRL stage in its own process with a fresh datasets cache, removed after with its output.

    Returns the process's measure and what the stage wrote (rows, inner seconds...).
    """
    cache = workdir / "hf_datasets_cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    trl_out = workdir / "trl.json"
    env = {"HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    try:
        run = measure(name, [*me, "--stage", "trl", *common, "--stage-out", str(trl_out)], workdir, env)
        return run, json.loads(trl_out.read_text())
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(workdir / "trl_out", ignore_errors=True)


def code_identity() -> dict[str, Any]:
    """Identify the packcli code measured: the commit and a hash of the working tree's sources."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted((REPO / "packcli").rglob("*")):
        if path.is_file() and path.suffix in (".py", ".jinja"):
            h.update(path.relative_to(REPO).as_posix().encode() + b"\0" + path.read_bytes())
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    versions = {}
    for name in ("tokenizers", "transformers", "datasets", "pyarrow", "numpy", "trl", "torch"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {"commit": commit, "packcli_sources_sha256": h.hexdigest()[:16], "versions": versions}


def _setup(args: argparse.Namespace) -> tuple[Path, Path, list[str], list[str]]:
    """Return the corpus, the work directory, this script's command and the stages' common arguments."""
    data = Path(args.data).resolve()
    if not data.exists():
        raise SystemExit(f"{data}: no such file; make it with benchmarks/make_chat_corpus.py")
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, str(Path(__file__).resolve())]
    common = ["--data", str(data), "--max-len", str(args.max_len), "--num-proc", str(args.num_proc)]
    common += ["--workdir", str(workdir)]
    return data, workdir, me, common


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    data, workdir, me, common = _setup(args)
    results: dict[str, Any] = {
        "data": str(data),
        "max_len": args.max_len,
        "num_proc": args.num_proc,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_start": os.getloadavg(),
        },
        "code": code_identity(),
    }

    # a. the tokenizer's own limit
    limit_out = workdir / "limit.json"
    limit_run = measure("limit", [*me, "--stage", "limit", *common, "--stage-out", str(limit_out)], workdir)
    limit = json.loads(limit_out.read_text())
    tokens = limit["tokens"]
    sec = limit["seconds"]
    results["corpus"] = {k: v for k, v in limit.items() if k not in ("seconds", "cpu_seconds")}
    results["limit"] = {
        "seconds": sec,
        "cpu_seconds": limit["cpu_seconds"],
        "tokens_per_second": tokens / sec["render_encode"],
        "encode_tokens_per_second": tokens / sec["encode"],
        "encode_batch_offsets_tokens_per_second": tokens / sec["encode_batch_offsets"],
        "peak_rss_mb": limit_run["peak_rss_mb"],
        "tree_peak_pss_mb": limit_run["tree_peak_pss_mb"],
        "process_seconds": limit_run["seconds"],
    }

    # b. the TRL path, fresh datasets cache
    if not args.skip_trl:
        trl_run, trl = trl_stage("trl", me, common, workdir)
        trl["inner_seconds"] = trl.pop("seconds")  # the steps, timed inside the process
        trl_run.pop("stdout")
        results["trl"] = {**trl, **trl_run, "tokens_per_second": tokens / trl_run["seconds"]}

    # c. packcli end to end, no cache
    results["packcli"] = packcli_run("packcli_nocache", data, args, workdir, ["--no-cache"], tokens)

    # d. packcli with a cold, then a warm cache
    cache_dir = workdir / "packcli_cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    with_cache = ["--cache-dir", str(cache_dir)]
    results["packcli_cache_cold"] = packcli_run(
        "packcli_cache_cold", data, args, workdir, [*with_cache, "--seed", "0"], tokens
    )
    results["packcli_cache_warm"] = packcli_run(
        "packcli_cache_warm", data, args, workdir, [*with_cache, "--seed", "1"], tokens
    )
    shutil.rmtree(cache_dir, ignore_errors=True)

    # e. memory on four copies of the data
    x4 = workdir / "data_x4.jsonl"
    with open(x4, "wb") as out:
        for _ in range(4):
            with open(data, "rb") as f:
                shutil.copyfileobj(f, out)
    results["packcli_x4"] = packcli_run("packcli_x4", x4, args, workdir, ["--no-cache"], 4 * tokens)
    x4.unlink()

    results["machine"]["loadavg_end"] = os.getloadavg()
    codes = {r["packcli_sources_sha256"] for k, r in results.items() if k.startswith("packcli")}
    if len(codes) > 1:
        print("[bench] warning: packcli's sources changed between the runs of this benchmark", file=sys.stderr)
    results["code"]["packcli_sources_changed_during_run"] = len(codes) > 1
    results["ratios"] = ratios(results)
    return results


def ratios(r: dict[str, Any]) -> dict[str, Any]:
    p, lim = r["packcli"], r["limit"]
    out: dict[str, Any] = {
        "packcli_over_limit_throughput": p["tokens_per_second"] / lim["tokens_per_second"],
        "packcli_over_encode_only_throughput": p["tokens_per_second"] / lim["encode_tokens_per_second"],
        "packcli_over_limit_tokens_per_cpu_second": lim["cpu_seconds"]["render_encode"] / p["cpu_seconds"]
        if p.get("cpu_seconds")
        else None,
        "cache_warm_over_cold_seconds": r["packcli_cache_warm"]["seconds"] / r["packcli_cache_cold"]["seconds"],
        "cache_warm_over_nocache_seconds": r["packcli_cache_warm"]["seconds"] / p["seconds"],
        "x4_over_x1_peak_rss": r["packcli_x4"]["peak_rss_mb"] / p["peak_rss_mb"],
        "x4_over_x1_seconds": r["packcli_x4"]["seconds"] / p["seconds"],
        "packcli_rows_over_lower_bound": p["rows"] / p["lower_bound_l2"] if p.get("lower_bound_l2") else None,
    }
    if p.get("tree_peak_pss_mb") and r["packcli_x4"].get("tree_peak_pss_mb"):
        out["x4_over_x1_tree_pss"] = r["packcli_x4"]["tree_peak_pss_mb"] / p["tree_peak_pss_mb"]
    if "trl" in r:
        t = r["trl"]
        out["speedup_vs_trl"] = t["seconds"] / p["seconds"]
        out["cpu_vs_trl"] = (
            t["cpu_seconds"] / p["cpu_seconds"] if t.get("cpu_seconds") and p.get("cpu_seconds") else None
        )
        out["rows_vs_trl"] = p["rows"] / t["rows"]
        out["rows_saved_vs_trl"] = t["rows"] - p["rows"]
        out["same_samples_as_trl"] = p["packed"] == t["samples"] and p["tokens"] == t["tokens"]
    return out


FIGURES = ("cpu_seconds", "rows", "fill", "peak_rss_mb", "tree_peak_pss_mb")


def _fmt(value: Any, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def table(r: dict[str, Any]) -> str:
    """Return the results as a markdown table plus the ratios."""
    lim = r["limit"]
    sec, cpu = lim["seconds"], lim["cpu_seconds"]
    tokens = r["corpus"]["tokens"]
    rows: list[dict[str, Any]] = []

    def add(label: str, seconds: float, tps: float, **more: Any) -> None:
        rows.append({"label": label, "seconds": seconds, "tokens_per_second": tps, **more})
        if more.get("cpu_seconds"):
            rows[-1]["tokens_per_cpu_second"] = tps * seconds / more["cpu_seconds"]

    add(
        "tokenizer limit: render + encode",
        sec["render_encode"],
        lim["tokens_per_second"],
        cpu_seconds=cpu["render_encode"],
        peak_rss_mb=lim["peak_rss_mb"],
        tree_peak_pss_mb=lim["tree_peak_pss_mb"],
    )
    add("  of which render (jinja)", sec["render"], tokens / sec["render"], cpu_seconds=cpu["render"])
    add(
        "  of which encode (tokenizer(texts))",
        sec["encode"],
        lim["encode_tokens_per_second"],
        cpu_seconds=cpu["encode"],
    )
    add("  encode_batch with offsets (packcli's call)", sec["encode_batch_offsets"],
        lim["encode_batch_offsets_tokens_per_second"], cpu_seconds=cpu["encode_batch_offsets"])  # fmt: skip
    keys = ["trl"] if "trl" in r else []
    keys += ["packcli", "packcli_cache_cold", "packcli_cache_warm", "packcli_x4"]
    labels = {
        "trl": "TRL map + pack_dataset(bfd) + to_parquet",
        "packcli": "packcli pack --no-cache",
        "packcli_cache_cold": "packcli pack, cache cold (miss)",
        "packcli_cache_warm": "packcli pack, cache warm (hit, other seed)",
        "packcli_x4": "packcli pack --no-cache, 4x data",
    }
    for key in keys:
        p = r[key]
        add(labels[key], p["seconds"], p["tokens_per_second"], **{k: p[k] for k in FIGURES if k in p})
    c = r["corpus"]
    lines = [
        f"Corpus: {c['conversations']:,} conversations, {c['tokens']:,} tokens (median {c['median_tokens']:.0f}, "
        f"mean {c['mean_tokens']:.0f}, p99 {c['p99_tokens']:.0f}, max {c['max_tokens']:,}; {c['over_max_len']} over "
        f"--max-len {r['max_len']}, {c['over_8k']} over 8k); --num-proc {r['num_proc']}; "
        f"{r['machine']['cpus']} CPUs, load average {r['machine']['loadavg_start'][0]:.1f} at the start and "
        f"{r['machine']['loadavg_end'][0]:.1f} at the end. tokens/s = corpus tokens / wall seconds; CPU s = user + "
        "system seconds of the run's processes (the limit rows: of the measured step).",
        "",
        "| run | seconds | tokens/s | CPU s | tokens/CPU-s | rows | fill | peak RSS MB (max process) "
        "| peak PSS MB (process tree) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        cells = [row["label"], f"{row['seconds']:.2f}", f"{row['tokens_per_second'] / 1e6:.3f} M"]
        cells.append(_fmt(row.get("cpu_seconds"), ".1f"))
        per_cpu = row.get("tokens_per_cpu_second")
        cells.append("—" if per_cpu is None else f"{per_cpu / 1e6:.3f} M")
        cells += [_fmt(row.get("rows"), ","), _fmt(row.get("fill"), ".4f")]
        cells += [_fmt(row.get("peak_rss_mb"), ",.0f"), _fmt(row.get("tree_peak_pss_mb"), ",.0f")]
        lines.append("| " + " | ".join(cells) + " |")
    q = r["ratios"]
    lines += [
        "",
        "| ratio | value |",
        "|---|---:|",
        f"| packcli / limit throughput (render + encode) | {q['packcli_over_limit_throughput']:.3f} |",
        f"| packcli / limit throughput (encode only) | {q['packcli_over_encode_only_throughput']:.3f} |",
        f"| packcli / limit tokens per CPU-second (render + encode) | "
        f"{_fmt(q.get('packcli_over_limit_tokens_per_cpu_second'), '.3f')} |",
    ]
    if "speedup_vs_trl" in q:
        lines += [
            f"| speedup vs TRL (TRL seconds / packcli seconds) | {q['speedup_vs_trl']:.2f}x |",
            f"| CPU vs TRL (TRL CPU seconds / packcli CPU seconds) | {_fmt(q.get('cpu_vs_trl'), '.2f')}x |",
            f"| rows vs TRL (packcli / TRL) | {q['rows_vs_trl']:.4f} ({q['rows_saved_vs_trl']:,} fewer) |",
            f"| same samples and tokens packed as TRL | {q['same_samples_as_trl']} |",
        ]
    lines += [
        f"| packcli rows / lower bound on rows (L2) | {_fmt(q.get('packcli_rows_over_lower_bound'), '.4f')} |",
        f"| cache warm rerun / cold cached run (seconds) | {q['cache_warm_over_cold_seconds']:.3f} |",
        f"| cache warm rerun / --no-cache run (seconds) | {q['cache_warm_over_nocache_seconds']:.3f} |",
        f"| peak RSS 4x / 1x (max process) | {q['x4_over_x1_peak_rss']:.2f} |",
    ]
    if "x4_over_x1_tree_pss" in q:
        lines.append(f"| peak PSS 4x / 1x (process tree) | {q['x4_over_x1_tree_pss']:.2f} |")
    lines.append(f"| seconds 4x / 1x | {q['x4_over_x1_seconds']:.2f} |")
    return "\n".join(lines)


# -- paired rounds: the ceiling, packcli and TRL one after another, ratios inside each round ----------


def ceiling_seconds(limit: dict[str, Any], cpus: int) -> float:
    """The parallel ceiling: rendering divided by the cores (as if perfectly parallel), plus one batched
    encode on all cores: the fastest of ``tokenizer(texts)``, ``encode_batch(texts)`` (with offsets, the
    call packcli makes) and ``encode_batch`` in chunks of CHUNK texts."""
    sec = limit["seconds"]
    encodes = [sec["encode_batch_offsets"], sec["encode"], sec.get("encode_batch_chunked", float("inf"))]
    return sec["render"] / cpus + min(encodes)


def run_rounds(args: argparse.Namespace) -> dict[str, Any]:
    """Run ``args.rounds`` rounds of packcli, the ceiling, packcli again, then TRL (unless --skip-trl).

    packcli runs before and after the ceiling, and its time in a round is the mean of the two: the
    machine's speed drifts over minutes, and a ceiling measured between two packcli runs sees the
    same drift on average (an A-B-A design). The ceiling is the fastest of three ways to call the
    encoder, each timed once in the round, which only makes it harder to reach.
    """
    data, workdir, me, common = _setup(args)
    cpus = os.cpu_count() or 1
    results: dict[str, Any] = {
        "data": str(data),
        "max_len": args.max_len,
        "num_proc": args.num_proc,
        "design": "per round: packcli, ceiling, packcli, [ideal], [TRL]; packcli's time is the mean of its two runs",
        "machine": {"cpus": cpus, "python": platform.python_version(), "loadavg_start": os.getloadavg()},
        "code": code_identity(),
        "rounds": [],
    }
    for k in range(args.rounds):
        before = packcli_run("packcli_nocache", data, args, workdir, ["--no-cache"], 0)
        limit_out = workdir / "limit.json"
        measure(f"round {k + 1}: ceiling", [*me, "--stage", "limit", *common, "--stage-out", str(limit_out)], workdir)
        limit = json.loads(limit_out.read_text())
        results["corpus"] = {key: v for key, v in limit.items() if key not in ("seconds", "cpu_seconds")}
        after = packcli_run("packcli_nocache", data, args, workdir, ["--no-cache"], 0)
        seconds = (before["seconds"] + after["seconds"]) / 2
        row: dict[str, Any] = {
            "ceiling_seconds": ceiling_seconds(limit, cpus),
            "limit_seconds": limit["seconds"],
            "packcli_seconds": seconds,
            "packcli_runs_seconds": [before["seconds"], after["seconds"]],
            "packcli_cpu_seconds": [before["cpu_seconds"], after["cpu_seconds"]],
            "packcli_peak_rss_mb": max(before["peak_rss_mb"], after["peak_rss_mb"]),
            "packcli_stage_seconds": before["stage_seconds"],
            "packcli_rows": before["rows"],
        }
        row["packcli_over_ceiling"] = row["ceiling_seconds"] / seconds
        # The same ratio against each way of calling the encoder alone (render / cores added to each).
        row["packcli_over_each_encode"] = {
            form: (limit["seconds"]["render"] / cpus + limit["seconds"][form]) / seconds
            for form in ("encode", "encode_batch_offsets", "encode_batch_chunked")
        }
        if args.ideal:
            serial_out = workdir / "serial.json"
            measure(f"round {k + 1}: serial", [*me, "--stage", "serial", *common, "--stage-out", str(serial_out)],
                    workdir)  # fmt: skip
            serial = json.loads(serial_out.read_text())["cpu_seconds"]
            row["ideal_seconds"] = (serial["render"] + serial["encode"]) / cpus
            row["packcli_over_ideal"] = row["ideal_seconds"] / seconds
        if not args.skip_trl:
            trl_run, trl = trl_stage(f"round {k + 1}: trl", me, common, workdir)
            row["trl_seconds"] = trl_run["seconds"]
            row["trl_rows"] = trl["rows"]
            # Against the packcli run next to it (the second), so that drift between the two is small.
            row["speedup_vs_trl"] = trl_run["seconds"] / after["seconds"]
        results["rounds"].append(row)
        shown = {key: round(v, 3) for key, v in row.items() if key.startswith(("packcli_over", "speedup"))
                 and isinstance(v, float)}  # fmt: skip
        print(f"[bench] round {k + 1}: {shown}", file=sys.stderr, flush=True)
    results["machine"]["loadavg_end"] = os.getloadavg()
    return results


def _median_range(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    n = len(ordered)
    mid = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    return mid, ordered[0], ordered[-1]


def rounds_table(r: dict[str, Any]) -> str:
    """Return the paired rounds as a markdown table: medians with the range of the in-round ratios."""
    rounds = r["rounds"]
    c = r["corpus"]
    lines = [
        f"Corpus: {c['conversations']:,} conversations, {c['tokens']:,} tokens (median {c['median_tokens']:.0f}, "
        f"p99 {c['p99_tokens']:.0f}, max {c['max_tokens']:,}); --max-len {r['max_len']}, --num-proc {r['num_proc']}, "
        f"{r['machine']['cpus']} CPUs; {len(rounds)} paired rounds; load average "
        f"{r['machine']['loadavg_start'][0]:.1f} at the start, {r['machine']['loadavg_end'][0]:.1f} at the end.",
        "",
        "| | seconds (median) | ratio (median of rounds) | range of ratios |",
        "|---|---:|---:|---:|",
    ]

    def med(key: str) -> float:
        return _median_range([x[key] for x in rounds])[0]

    lines.append(f"| the ceiling: render / {r['machine']['cpus']} cores + one batched encode on all cores "
                 f"| {med('ceiling_seconds'):.2f} | | |")  # fmt: skip
    if all("ideal_seconds" in x for x in rounds):
        lines.append(f"| the ideal: (render + encode on one thread, CPU seconds) / {r['machine']['cpus']} cores "
                     f"| {med('ideal_seconds'):.2f} | | |")  # fmt: skip
    m, lo, hi = _median_range([x["packcli_over_ceiling"] for x in rounds])
    lines.append(f"| `packcli pack --no-cache` (whole process) | {med('packcli_seconds'):.2f} | {m:.2f}x the ceiling "
                 f"| {lo:.2f}–{hi:.2f} |")  # fmt: skip
    if all("packcli_over_each_encode" in x for x in rounds):
        for form, label in (("encode", "tokenizer(texts)"), ("encode_batch_offsets", "encode_batch, one call"),
                            ("encode_batch_chunked", f"encode_batch in chunks of {CHUNK:,}")):  # fmt: skip
            m, lo, hi = _median_range([x["packcli_over_each_encode"][form] for x in rounds])
            lines.append(f"| ... against render / cores + {label} alone | | {m:.2f}x | {lo:.2f}–{hi:.2f} |")
    if all("packcli_over_ideal" in x for x in rounds):
        m, lo, hi = _median_range([x["packcli_over_ideal"] for x in rounds])
        lines.append(f"| `packcli pack --no-cache` against the ideal | | {m:.2f}x the ideal | {lo:.2f}–{hi:.2f} |")
    if all("trl_seconds" in x for x in rounds):
        m, lo, hi = _median_range([x["speedup_vs_trl"] for x in rounds])
        lines.append(f"| TRL path (whole process) | {med('trl_seconds'):.2f} | packcli {m:.2f}x faster "
                     f"| {lo:.2f}–{hi:.2f} |")  # fmt: skip
    stages = rounds[0]["packcli_stage_seconds"]
    lines += ["", "stage_seconds of round 1's packcli run: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="benchmarks/data/chat.jsonl", help="JSONL chat file")
    parser.add_argument("--max-len", type=int, default=4096, help="tokens per packed row [4096]")
    parser.add_argument("--num-proc", type=int, default=2, help="processes for TRL's map and packcli [2]")
    parser.add_argument("--skip-trl", action="store_true", help="leave out the TRL path")
    parser.add_argument("--workdir", default="benchmarks/results", help="scratch and results directory")
    parser.add_argument("--table-from", metavar="JSON", help="only print the table of a saved bench_results.json")
    parser.add_argument(
        "--rounds",
        type=int,
        default=0,
        help="paired mode: N rounds of packcli --no-cache, the ceiling, packcli again and TRL, ratios taken "
        "inside each round [off]",
    )
    parser.add_argument(
        "--ideal", action="store_true", help="paired mode: also time render + encode on one thread in each round"
    )
    parser.add_argument("--stage", choices=("limit", "serial", "trl"), help=argparse.SUPPRESS)
    parser.add_argument("--stage-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage == "limit":
        stage_limit(Path(args.data), args.max_len, Path(args.stage_out))
        return 0
    if args.stage == "serial":
        stage_serial(Path(args.data), Path(args.stage_out))
        return 0
    if args.stage == "trl":
        stage_trl(Path(args.data), args.max_len, args.num_proc, Path(args.workdir), Path(args.stage_out))
        return 0
    if args.table_from:
        results = json.loads(Path(args.table_from).read_text())
        if "rounds" in results:
            print(rounds_table(results))
            return 0
        results["ratios"] = ratios(results)
        print(table(results))
        return 0
    if args.rounds:
        results = run_rounds(args)
        _save(Path(args.workdir), "bench_rounds", results, rounds_table(results))
        return 0
    results = run_all(args)
    _save(Path(args.workdir), "bench_results", results, table(results))
    return 0


def _save(workdir: Path, stem: str, results: dict[str, Any], text: str) -> None:
    """Write the results as WORKDIR/STEM.json and the table as WORKDIR/STEM.md, and print the table."""
    (workdir / f"{stem}.json").write_text(json.dumps(results, indent=2))
    (workdir / f"{stem}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
