"""Deterministic generator for the shared benchmark datasets.

Tabular dataset (default ``benchmarks/data/parquet4m/``): 4,000,000 rows in 32 Parquet files,
row groups of 131,072 rows, snappy compression, columns::

    i64    int64     row id (0..N-1, globally unique, in file order)
    f64    float64   standard normal
    f32    float32   uniform [0, 1)
    short  string    8 chars, drawn from a 1,000-entry vocabulary (low cardinality)
    text   string    40..80 random lowercase letters/spaces (mean 60), high cardinality
    emb    fixed_size_list<float32, 64>   standard normal

``emb`` is written as ``fixed_size_list`` (not ``list``): pyarrow reads it back as the same type
and turns it into a 2-D array with one ``flatten()`` + ``reshape`` and no offsets buffer; see
``--emb-type`` to write a variable ``list<float32>`` instead for comparisons.

``--small`` writes 40,000 rows in 4 files to ``benchmarks/data/parquet40k/`` for smoke tests.

``--images`` writes 20,000 images of 32x32x3 uint8 (``benchmarks/data/images20k/``, 4 files)
stored as *raw* bytes (3,072 bytes, HWC order, C-contiguous) in a ``binary`` column ``image``,
alongside ``label`` (int64, 0..9), ``height``/``width``/``channels`` (int32). Raw bytes, because
decoding them is ``np.frombuffer(b, np.uint8).reshape(32, 32, 3)``; ``--image-format png``
stores PNG-encoded bytes instead (needs Pillow) for a decode-heavy variant.

Every file is produced from ``numpy.random.default_rng([seed, file_index])``, so output is
byte-for-byte reproducible and files can be produced in any order. Generation is idempotent: a
``_MANIFEST.json`` is written last; if it is present, matches the requested parameters and every
file has the expected row count, nothing is done (``--force`` regenerates).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
DEFAULT_FULL = DATA_DIR / "parquet4m"
DEFAULT_SMALL = DATA_DIR / "parquet40k"
DEFAULT_IMAGES = DATA_DIR / "images20k"
MANIFEST = "_MANIFEST.json"
FORMAT_VERSION = 1

_LETTERS = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)


def _vocab(seed: int, size: int = 1000, width: int = 8) -> pa.Array:
    rng = np.random.default_rng([seed, 0xABCD])
    codes = rng.integers(ord("a"), ord("z") + 1, size=(size, width), dtype=np.uint8)
    return pa.array([bytes(row).decode("ascii") for row in codes], type=pa.string())


def _text(rng: np.random.Generator, n: int, lo: int = 40, hi: int = 80) -> pa.Array:
    lengths = rng.integers(lo, hi + 1, size=n, dtype=np.int32)
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    data = _LETTERS[rng.integers(0, len(_LETTERS), size=int(offsets[-1]), dtype=np.uint8)]
    return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))


def _emb(rng: np.random.Generator, n: int, dim: int, emb_type: str) -> pa.Array:
    flat = pa.array(rng.standard_normal(n * dim, dtype=np.float32))
    if emb_type == "fixed_size_list":
        return pa.FixedSizeListArray.from_arrays(flat, dim)
    offsets = pa.array(np.arange(0, n * dim + 1, dim, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, flat)


def tabular_table(seed: int, file_index: int, start: int, n: int, dim: int, emb_type: str,
                  vocab: pa.Array) -> pa.Table:
    rng = np.random.default_rng([seed, file_index])
    return pa.table({
        "i64": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "f64": pa.array(rng.standard_normal(n)),
        "f32": pa.array(rng.random(n, dtype=np.float32)),
        "short": vocab.take(pa.array(rng.integers(0, len(vocab), size=n))),
        "text": _text(rng, n),
        "emb": _emb(rng, n, dim, emb_type),
    })


def _png_bytes(img: np.ndarray) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="PNG")
    return buf.getvalue()


def image_table(seed: int, file_index: int, start: int, n: int, fmt: str) -> pa.Table:
    rng = np.random.default_rng([seed, 0x1A6E, file_index])
    labels = rng.integers(0, 10, size=n)
    # Smooth-ish images (a per-image colour gradient plus noise) so PNG has something to compress.
    yy, xx = np.mgrid[0:32, 0:32].astype(np.float32)
    base = rng.integers(0, 256, size=(n, 1, 1, 3)).astype(np.float32)
    slope = rng.normal(0, 3, size=(n, 1, 1, 3)).astype(np.float32)
    noise = rng.normal(0, 8, size=(n, 32, 32, 3)).astype(np.float32)
    imgs = np.clip(base + slope * (yy + xx)[None, :, :, None] + noise, 0, 255).astype(np.uint8)
    if fmt == "raw":
        images = [imgs[k].tobytes() for k in range(n)]
    else:
        images = [_png_bytes(imgs[k]) for k in range(n)]
    return pa.table({
        "id": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "image": pa.array(images, type=pa.binary()),
        "label": pa.array(labels, type=pa.int64()),
        "height": pa.array(np.full(n, 32, dtype=np.int32)),
        "width": pa.array(np.full(n, 32, dtype=np.int32)),
        "channels": pa.array(np.full(n, 3, dtype=np.int32)),
    })


def _split(rows: int, files: int) -> list[tuple[int, int]]:
    base, extra = divmod(rows, files)
    out, start = [], 0
    for k in range(files):
        n = base + (1 if k < extra else 0)
        out.append((start, n))
        start += n
    return out


def _is_complete(out: Path, params: dict) -> bool:
    man = out / MANIFEST
    if not man.exists():
        return False
    try:
        recorded = json.loads(man.read_text())
    except (OSError, ValueError):
        return False
    if recorded.get("params") != params:
        return False
    for name, nrows in recorded.get("files", {}).items():
        p = out / name
        if not p.exists():
            return False
        try:
            if pq.ParquetFile(p).metadata.num_rows != nrows:
                return False
        except (OSError, pa.ArrowException):
            return False
    return len(recorded.get("files", {})) == params["files"]


def generate(out: Path, params: dict, make_table, force: bool = False, quiet: bool = False) -> Path:
    """Write ``params['files']`` Parquet files into ``out`` unless already complete."""
    out = Path(out)
    if not force and _is_complete(out, params):
        if not quiet:
            print(f"{out}: complete, nothing to do")
        return out
    out.mkdir(parents=True, exist_ok=True)
    man = out / MANIFEST
    if man.exists():
        man.unlink()
    for stale in out.glob("*.parquet"):
        stale.unlink()
    t0 = time.perf_counter()
    files = {}
    for k, (start, n) in enumerate(_split(params["rows"], params["files"])):
        name = f"part-{k:05d}.parquet"
        table = make_table(k, start, n)
        tmp = out / (name + ".tmp")
        pq.write_table(table, tmp, row_group_size=params["row_group_size"],
                       compression=params["compression"],
                       use_dictionary=params.get("dictionary_columns", True))
        os.replace(tmp, out / name)
        files[name] = n
        if not quiet:
            print(f"  {name}: {n} rows ({(out / name).stat().st_size / 2**20:.1f} MiB)", flush=True)
    size = sum((out / f).stat().st_size for f in files)
    man.write_text(json.dumps({"params": params, "files": files, "bytes": size}, indent=1))
    if not quiet:
        print(f"{out}: {params['rows']} rows, {len(files)} files, {size / 2**30:.3f} GiB, "
              f"{time.perf_counter() - t0:.1f} s")
    return out


def ensure_tabular(small: bool = False, out: Path | None = None, rows: int | None = None,
                   files: int | None = None, seed: int = 42, emb_type: str = "fixed_size_list",
                   dim: int = 64, row_group_size: int = 131_072, force: bool = False,
                   quiet: bool = False) -> Path:
    if small:
        rows = rows or 40_000
        files = files or 4
        row_group_size = min(row_group_size, 4_096)
        out = out or DEFAULT_SMALL
    rows = rows or 4_000_000
    files = files or 32
    out = out or DEFAULT_FULL
    params = {"kind": "tabular", "version": FORMAT_VERSION, "rows": rows, "files": files,
              "seed": seed, "emb_type": emb_type, "dim": dim, "row_group_size": row_group_size,
              "compression": "snappy", "dictionary_columns": ["short"]}
    vocab = _vocab(seed)
    return generate(out, params,
                    lambda k, start, n: tabular_table(seed, k, start, n, dim, emb_type, vocab),
                    force=force, quiet=quiet)


def ensure_images(out: Path | None = None, rows: int = 20_000, files: int = 4, seed: int = 42,
                  fmt: str = "raw", force: bool = False, quiet: bool = False) -> Path:
    out = out or (DEFAULT_IMAGES if fmt == "raw" else DATA_DIR / "images20k_png")
    params = {"kind": "images", "version": FORMAT_VERSION, "rows": rows, "files": files,
              "seed": seed, "format": fmt, "shape": [32, 32, 3], "row_group_size": 1_000,
              "compression": "snappy" if fmt == "raw" else "none", "dictionary_columns": []}
    return generate(out, params, lambda k, start, n: image_table(seed, k, start, n, fmt),
                    force=force, quiet=quiet)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="40k rows / 4 files smoke-test dataset")
    ap.add_argument("--images", action="store_true", help="generate the 20k-image dataset instead")
    ap.add_argument("--image-format", choices=["raw", "png"], default="raw")
    ap.add_argument("--out", type=Path, help="output directory")
    ap.add_argument("--rows", type=int)
    ap.add_argument("--files", type=int)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--emb-type", choices=["fixed_size_list", "list"], default="fixed_size_list")
    ap.add_argument("--row-group-size", type=int, default=131_072)
    ap.add_argument("--force", action="store_true", help="regenerate even if complete")
    args = ap.parse_args(argv)
    if args.images:
        ensure_images(out=args.out, rows=args.rows or 20_000, files=args.files or 4, seed=args.seed,
                      fmt=args.image_format, force=args.force)
    else:
        ensure_tabular(small=args.small, out=args.out, rows=args.rows, files=args.files,
                       seed=args.seed, emb_type=args.emb_type, row_group_size=args.row_group_size,
                       force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
