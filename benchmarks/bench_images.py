"""Image-text packing: fill and rows against the L2 bound, and seconds per 1,000 samples.

Writes an image-text corpus (Hugging Face convention: ``{"images": [...], "messages": [...]}``, paths
relative to the data file) with a pool of images of realistic sizes (photos, documents, screenshots,
small crops; JPEG, some with an EXIF rotation) and a Qwen2.5-VL processor directory (the real image
processor configuration with ``--max-pixels``, the default tokenizer with the vision tokens, the official
template). Then, in paired rounds, times:

- ``header``: what packcli reads of each image, its size from the file header (``image_size``);
- ``decode``: what processor-based preprocessing does per image: load it (EXIF applied), decode it to
  RGB and run the image processor to learn its grid;
- ``pack``: ``packcli pack --processor DIR --no-cache`` end to end (tokenize, plan, write), and the
  same corpus with every record twice: the difference is the cost per sample, the start-up aside
  (loading transformers, which imports PyTorch when it is installed, and the processor).

and prints the pack's rows, fill and the L1/L2 row bounds. Seconds are per 1,000 samples.

    python benchmarks/bench_images.py --samples 2000 --images 300 --max-len 8192 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (width, height) families: photos, documents, screenshots, small crops, and their weights.
SIZES = [
    ((640, 480), 4), ((800, 600), 2), ((1024, 768), 2), ((480, 640), 2), ((1280, 960), 1),
    ((850, 1100), 2), ((1700, 2200), 1), ((1240, 1754), 1),
    ((1280, 720), 2), ((1920, 1080), 2), ((1366, 768), 1),
    ((64, 64), 1), ((224, 224), 2), ((300, 120), 1), ((150, 400), 1),
]  # fmt: skip
WORDS = str.split(
    "the image shows a chart with several lines and a legend at the top while the table below lists values "
    "for each quarter and a note explains the method used to compute the totals in the last column"
)


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


def make_corpus(folder: Path, samples: int, images: int, seed: int) -> Path:
    """Write ``images`` JPEG files and ``samples`` conversations using them; return the data file."""
    import numpy as np
    from PIL import Image

    rng = random.Random(seed)
    (folder / "img").mkdir(parents=True, exist_ok=True)
    names = []
    sizes, weights = zip(*SIZES, strict=True)
    for k in range(images):
        w, h = rng.choices(sizes, weights)[0]
        w, h = max(28, int(w * rng.uniform(0.8, 1.2))), max(28, int(h * rng.uniform(0.8, 1.2)))
        pixels = np.random.default_rng(k).integers(0, 255, (h, w, 3), dtype=np.uint8)
        exif = Image.Exif()
        if k % 10 == 0:
            exif[0x0112] = 6  # a phone photo taken upright: the loader turns it
        name = f"img/{k:05d}.jpg"
        Image.fromarray(pixels).save(folder / name, quality=85, exif=exif)
        names.append(name)
    data = folder / "data.jsonl"
    with data.open("w", encoding="utf-8") as fh:
        for _ in range(samples):
            n_images = rng.choices([0, 1, 2], [3, 5, 2])[0]
            used = [rng.choice(names) for _ in range(n_images)]
            user = [{"type": "image"} for _ in used] + [{"type": "text", "text": _text(rng, 5, 40)}]
            messages = [
                {"role": "user", "content": user},
                {"role": "assistant", "content": [{"type": "text", "text": _text(rng, 20, 250)}]},
            ]
            if rng.random() < 0.3:
                messages += [
                    {"role": "user", "content": [{"type": "text", "text": _text(rng, 5, 30)}]},
                    {"role": "assistant", "content": [{"type": "text", "text": _text(rng, 10, 150)}]},
                ]
            fh.write(json.dumps({"images": used, "messages": messages}) + "\n")
    return data


def _image_paths(data: Path) -> list[Path]:
    paths = []
    for line in data.read_text(encoding="utf-8").splitlines():
        paths += [data.parent / name for name in json.loads(line)["images"]]
    return paths


def time_header(paths: list[Path]) -> float:
    from packcli.vision import ImageRef, image_size

    start = time.perf_counter()
    for path in paths:
        image_size(ImageRef(path=str(path)))
    return time.perf_counter() - start


def time_decode(paths: list[Path], processor: Path) -> float:
    from PIL import Image, ImageOps

    from packcli.vision import load_processor

    image_processor = load_processor(str(processor)).image_processor
    start = time.perf_counter()
    for path in paths:
        with Image.open(path) as im:
            image = ImageOps.exif_transpose(im).convert("RGB")
        image_processor(images=[image])["image_grid_thw"]
    return time.perf_counter() - start


def time_pack(data: Path, processor: Path, max_len: int, out: Path) -> tuple[float, dict]:
    cmd = [
        sys.executable, "-m", "packcli", "pack", str(data), "--processor", str(processor), "--max-len",
        str(max_len), "-o", str(out), "--overwrite", "--no-cache", "--json", "--quiet",
    ]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=tempfile.gettempdir())
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"packcli failed ({done.returncode}): {done.stderr.strip()}")
    return seconds, json.loads(done.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--images", type=int, default=300, help="distinct image files the samples draw from")
    ap.add_argument("--max-len", type=int, default=8192)
    ap.add_argument("--max-pixels", type=int, default=1003520, help="the image processor's max_pixels")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from tests.vision import make_qwen2_vl_processor

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = make_corpus(folder / "corpus", args.samples, args.images, args.seed)
        processor = make_qwen2_vl_processor(folder / "processor", max_pixels=args.max_pixels)
        paths = _image_paths(data)
        per_k = 1000 / args.samples
        double = data.with_name("data2.jsonl")  # every record twice: the pack's cost per sample, start-up aside
        double.write_text(data.read_text(encoding="utf-8") * 2, encoding="utf-8")
        header, decode, pack, marginal = [], [], [], []
        summary: dict = {}
        for _ in range(args.rounds):
            header.append(time_header(paths) * per_k)
            decode.append(time_decode(paths, processor) * per_k)
            seconds, summary = time_pack(data, processor, args.max_len, folder / "out")
            twice, _ = time_pack(double, processor, args.max_len, folder / "out2")
            pack.append(seconds * per_k)
            marginal.append((twice - seconds) * per_k)
        ratios = sorted(d / h for d, h in zip(decode, header, strict=True))
        print(
            f"{args.samples:,} samples, {len(paths):,} image references ({args.images} files), max-len {args.max_len}"
        )
        print("| per 1,000 samples | median s | range |")
        print("|---|---:|---|")
        for name, values in (
            ("header (packcli)", header),
            ("decode + image processor", decode),
            ("pack end to end", pack),
            ("pack, per sample beyond start-up", marginal),
        ):
            print(f"| {name} | {statistics.median(values):.3f} | {min(values):.3f}-{max(values):.3f} |")
        print(f"decode / header, in-round: median {statistics.median(ratios):.1f}x ({ratios[0]:.1f}-{ratios[-1]:.1f})")
        keys = ("rows", "fill", "lower_bound_l1", "lower_bound_l2", "rows_over_l2", "tokens", "trainable_tokens")
        print(json.dumps({k: summary.get(k) for k in keys}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
