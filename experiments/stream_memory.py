"""Peak memory of reading an epoch of image shards with zoo's streaming loader (data=images_stream) while the data
set grows 1x -> 8x, against holding the same images in memory as zoo's in-memory image modules do.

    python experiments/stream_memory.py                       # 20,000 3x32x32 images at 1x, 160,000 at 8x
    python experiments/stream_memory.py --quick               # tiny sizes, one batch each: checks the script runs

Each scale: synthetic uint8 images are written as litdata shards (conversion time and rate), then a fresh process
reads one epoch through StreamingImagesDataModule's loader (normalised batches of 256) and reports its peak RSS
(ru_maxrss, which counts the pages of the chunk files litdata maps, and RssAnon sampled after each batch: the
process's own memory) and read rate; a second fresh process reads the shards into one uint8 tensor (what an
in-memory module holds). Results go to experiments/results/data_at_scale.md with the CPU and date.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "experiments" / "results" / "data_at_scale.md"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", type=int, default=20000, help="images at scale 1x")
    parser.add_argument("--scales", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="64 images at 1x, one batch per read")
    parser.add_argument("--output", type=Path, default=RESULTS, help="markdown page ('-': print only)")
    parser.add_argument("--measure", nargs=2, metavar=("HOW", "FOLDER"), help=argparse.SUPPRESS)
    parser.add_argument("--batches", type=int, default=0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def write_synthetic_shards(out: Path, count: int, size: int) -> float:
    """`count` random 3 x size x size images with labels as an images shards folder; returns the seconds taken."""
    from litdata.streaming.writer import BinaryWriter

    from zoo.data.shards import FORMAT_VERSION, META, chunk_checks

    began = time.perf_counter()
    rng = np.random.default_rng(0)
    meta = {"format": FORMAT_VERSION, "kind": "images", "source": "synthetic", "classes": [str(c) for c in range(10)],
            "image_size": size, "in_channels": 3, "mean": [0.5] * 3, "std": [0.5] * 3, "batch_augmentation": None,
            "black": [-1.0] * 3, "splits": {}}  # fmt: skip
    for split, items in (("train", count), ("val", 8), ("test", 8)):
        writer = BinaryWriter(str(out / split), chunk_bytes="64MB")
        for index in range(items):
            image = rng.integers(0, 256, (3, size, size), dtype=np.uint8)
            writer[index] = {"index": index, "image": image, "label": int(index % 10)}
        writer.done()
        writer.merge()
        meta["splits"][split] = {"items": items, "chunks": chunk_checks(out / split)}
    (out / META).write_text(json.dumps(meta))
    return time.perf_counter() - began


def anonymous_mib() -> float:
    """RssAnon of this process (Linux): its own memory, without file pages mapped in (litdata maps chunk files,
    whose resident pages are page cache the kernel can drop, yet count in ru_maxrss)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) / 1024
    return 0.0


def measure(how: str, folder: str, batch_size: int, batches: int) -> None:
    """In a fresh process: read the training split (streamed, or whole into memory) and print peak RSS and rate."""
    import torch

    from zoo.data.shards import StreamingImagesDataModule

    module = StreamingImagesDataModule(data_dir=folder, batch_size=batch_size, augment=False, shuffle=True)
    began, seen, anonymous = time.perf_counter(), 0, anonymous_mib()
    if how == "stream":
        for number, (images, _) in enumerate(module.stream_loader("train"), 1):
            seen += len(images)
            anonymous = max(anonymous, anonymous_mib())
            if number == batches:
                break
    else:  # the in-memory modules' way: every image in one uint8 tensor, then batches from it
        held = [torch.as_tensor(s["image"]) for s in module.dataset("train")]
        images = torch.stack(held)
        anonymous = max(anonymous, anonymous_mib())
        del held
        for start in range(0, len(images), batch_size):
            batch = images[start : start + batch_size].float().div(255)
            seen += len(batch)
            if batches and start // batch_size + 1 == batches:
                break
    elapsed = time.perf_counter() - began
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"peak_mib": peak, "anonymous_mib": anonymous, "images": seen, "seconds": elapsed}))


def child(how: str, folder: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--measure", how, str(folder), "--batch-size", str(args.batch_size)]
    command += ["--batches", str(1 if args.quick else 0)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if args.measure:
        measure(*args.measure, args.batch_size, args.batches)
        return []
    base = 64 if args.quick else args.base
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="stream-memory-"))
    try:
        for scale in args.scales:
            folder = scratch / f"x{scale}"
            count = base * scale
            seconds = write_synthetic_shards(folder, count, args.image_size)
            megabytes = sum(p.stat().st_size for p in (folder / "train").glob("*.bin")) / 2**20
            stream, memory = child("stream", folder, args), child("memory", folder, args)
            rows.append({"scale": scale, "images": count, "shard_mib": megabytes, "write_rate": count / seconds,
                         "stream_peak": stream["peak_mib"], "stream_rate": stream["images"] / stream["seconds"],
                         "memory_peak": memory["peak_mib"], "stream_anon": stream["anonymous_mib"],
                         "memory_anon": memory["anonymous_mib"]})  # fmt: skip
            shutil.rmtree(folder)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [
        f"Images 3x{args.image_size}x{args.image_size} uint8, batches of {args.batch_size}; {cpu_name()}, "
        f"{date.today().isoformat()}{' (--quick: one batch per read)' if args.quick else ''}.",
        "",
        "| scale | images | shards (MiB) | conversion (images/s) | streamed: images/s | streamed: peak RSS "
        "(MiB) | streamed: peak anonymous (MiB) | in memory: peak RSS (MiB) | in memory: peak anonymous (MiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['scale']}x | {r['images']:,} | {r['shard_mib']:.0f} | {r['write_rate']:,.0f} | "
            f"{r['stream_rate']:,.0f} | {r['stream_peak']:.0f} | {r['stream_anon']:.0f} | {r['memory_peak']:.0f} | "
            f"{r['memory_anon']:.0f} |"
        )
    table = "\n".join(lines)
    print(table)
    if str(args.output) != "-":
        header = "# Data at scale: streaming shards\n\nWritten by `python experiments/stream_memory.py`.\n\n"
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(header + table + "\n")
        print(f"written to {args.output}")
    return rows


if __name__ == "__main__":
    main()
