"""Render the HTML report of ``packcli stats --plot`` in headless Chromium and save screenshots.

    apt-get install chromium-headless-shell      # or chromium (Debian packages)
    python benchmarks/screenshot_report.py --out /tmp/report-shots

Makes a small chat corpus with a long tail and one 60k-token outlier, runs ``packcli stats --plot``
on it as raw input (max lengths 512, 1024, 2048) and on its ``packcli pack --max-len 1024`` output,
and screenshots both pages (raw.png, packed.png). What to look at: the sample-length bins stay
narrow (the outlier has its own last bin), every chart has axis titles and tick values, the packed
page has the samples-per-row chart, and the dropped counts are in the summary tables.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def make_corpus(path: Path, n: int = 400, seed: int = 0) -> None:
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(n):
            words = 60_000 if i == 7 else rng.randint(5, 300)
            messages = [
                {"role": "user", "content": "question " * 5},
                {"role": "assistant", "content": "word " * words},
            ]
            fh.write(json.dumps({"messages": messages}) + "\n")


def packcli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "packcli", *args], check=True, stdout=subprocess.DEVNULL)


def screenshot(browser: str, page: Path, png: Path, height: int) -> None:
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--window-size=900,{height}",
            f"--screenshot={png}",
            page.resolve().as_uri(),
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    data = png.read_bytes()
    if not data.startswith(b"\x89PNG") or len(data) < 10_000:
        raise SystemExit(f"{png}: not a screenshot of the page ({len(data)} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("report-shots"))
    parser.add_argument("--browser", help="the Chromium binary [default: the first of " + ", ".join(BROWSERS) + "]")
    args = parser.parse_args()
    browser = args.browser or next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        raise SystemExit("no Chromium found; apt-get install chromium-headless-shell (or chromium), or pass --browser")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.jsonl"
    make_corpus(corpus)
    common = ["--num-proc", "2", "--cache-dir", str(out / "cache")]
    packcli("stats", str(corpus), "--max-len", "512,1024,2048", "--plot", str(out / "raw.html"), *common)
    packcli("pack", str(corpus), "--max-len", "1024", "-o", str(out / "packed"), "--overwrite", "-q", *common)
    packcli("stats", str(out / "packed"), "--plot", str(out / "packed.html"))
    for name, height in (("raw", 2400), ("packed", 1600)):
        page = out / f"{name}.html"
        charts = page.read_text(encoding="utf-8").count("<svg")
        screenshot(browser, page, out / f"{name}.png", height)
        print(f"{out / f'{name}.png'}: {charts} charts")


if __name__ == "__main__":
    main()
