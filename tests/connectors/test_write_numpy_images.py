"""write_numpy (one .npy per write task) and write_images (one file per row), both staged and
committed atomically by the file sink."""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import dataflow
from connectors.file_datasink import SUCCESS_MARKER
from connectors.image_format import ImageDatasink


def _data_files(folder: Path, suffix: str) -> list[Path]:
    return sorted(p for p in folder.rglob(f"*{suffix}") if not p.name.startswith(("_", ".")))


def _no_staging(folder: Path) -> bool:
    return not any(name.startswith("_staging") for name in os.listdir(folder))


def test_write_numpy_tensor_column_round_trips(tmp_path: Path, mode: str) -> None:
    array = np.arange(6 * 3 * 4, dtype=np.float32).reshape(6, 3, 4)
    dest = tmp_path / "out"
    dataflow.from_numpy(array).write_numpy(str(dest), column="data")
    files = _data_files(dest, ".npy")
    assert len(files) == 1 and (dest / SUCCESS_MARKER).exists() and _no_staging(dest)
    loaded = np.load(files[0], allow_pickle=False)
    assert loaded.dtype == np.float32 and np.array_equal(loaded, array)
    back = dataflow.read_numpy(str(dest)).to_arrow()
    assert np.array_equal(back["data"].combine_chunks().to_numpy_ndarray(), array)


def test_write_numpy_one_file_per_block_of_a_column(tmp_path: Path, mode: str) -> None:
    dest = tmp_path / "ids"
    dataflow.range(90).repartition(3).write_numpy(str(dest), column="id")
    files = _data_files(dest, ".npy")
    assert len(files) == 3
    values = np.concatenate([np.load(f, allow_pickle=False) for f in files])
    assert sorted(values.tolist()) == list(range(90))


def test_write_numpy_strings_and_max_rows_per_file(tmp_path: Path, mode: str) -> None:
    dest = tmp_path / "names"
    dataflow.from_items([{"name": f"n{i}"} for i in range(10)], override_num_blocks=1).write_numpy(str(dest), column="name", max_rows_per_file=4)
    files = _data_files(dest, ".npy")
    assert [len(np.load(f, allow_pickle=False)) for f in files] == [4, 4, 2]
    assert np.concatenate([np.load(f, allow_pickle=False) for f in files]).tolist() == [f"n{i}" for i in range(10)]


def test_write_numpy_refuses_what_needs_pickling_and_leaves_nothing(tmp_path: Path, mode: str) -> None:
    dest = tmp_path / "ragged"
    ds = dataflow.from_items([{"v": [1, 2]}, {"v": [3]}], override_num_blocks=1)
    with pytest.raises(TypeError, match=r"column 'v' \(list<item: int64>\) cannot be written to \.npy without pickling"):
        ds.write_numpy(str(dest), column="v")
    assert not dest.exists()  # the failed job removed the folder it had created
    with pytest.raises(ValueError, match="no column 'missing'"):
        ds.write_numpy(str(tmp_path / "other"), column="missing")


def test_write_images_one_png_per_row_pixel_exact(tmp_path: Path, mode: str) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 6, 8, 3), dtype=np.uint8)
    dest = tmp_path / "imgs"
    dataflow.from_numpy(images).write_images(str(dest), column="data")
    files = _data_files(dest, ".png")
    assert len(files) == 5 and (dest / SUCCESS_MARKER).exists() and _no_staging(dest)
    decoded = sorted((np.asarray(Image.open(f)) for f in files), key=lambda a: a.tobytes())
    expected = sorted(images, key=lambda a: a.tobytes())
    assert all(np.array_equal(a, b) for a, b in zip(decoded, expected, strict=True))
    back = dataflow.read_images(str(dest)).to_arrow()
    assert back.num_rows == 5


def test_write_images_grayscale_and_jpeg(tmp_path: Path, mode: str) -> None:
    gray = np.tile(np.arange(16, dtype=np.uint8) * 16, (3, 16, 1))  # (3 rows, 16, 16): one channel
    dataflow.from_numpy(gray[..., np.newaxis]).write_images(str(tmp_path / "gray"), column="data")
    files = _data_files(tmp_path / "gray", ".png")
    with Image.open(files[0]) as image:
        assert image.mode == "L" and np.array_equal(np.asarray(image), gray[0])
    dataflow.from_numpy(np.zeros((2, 8, 8, 3), np.uint8)).write_images(str(tmp_path / "jpg"), "data", "jpg")
    files = _data_files(tmp_path / "jpg", ".jpg")
    assert len(files) == 2
    assert Image.open(io.BytesIO(files[0].read_bytes())).format == "JPEG"


def test_write_images_errors(tmp_path: Path, mode: str) -> None:
    with pytest.raises(ValueError, match="file_format 'nope' is not one Pillow can write"):
        ImageDatasink(str(tmp_path / "x"), column="image", file_format="nope")
    ds = dataflow.from_items([{"name": "a"}])
    with pytest.raises(TypeError, match=r"write_images: column 'name' \(string\) cannot be encoded as PNG"):
        ds.write_images(str(tmp_path / "bad"), column="name")
    assert not (tmp_path / "bad").exists()  # the failed job removed the folder it had created


def test_mode_and_filename_provider_as_every_file_sink(tmp_path: Path, mode: str) -> None:
    dest = tmp_path / "modes"
    dataflow.range(10, override_num_blocks=1).write_numpy(str(dest), column="id")
    dataflow.range(5, override_num_blocks=1).write_numpy(str(dest), column="id", mode="overwrite")
    (only,) = _data_files(dest, ".npy")
    assert np.load(only, allow_pickle=False).tolist() == list(range(5))

    class Named(dataflow.FilenameProvider):
        def get_filename_for_task(self, write_uuid: str, task_index: int) -> str:
            return f"img-{task_index}-{{i}}.png"

    images = np.zeros((3, 4, 4, 3), np.uint8)
    dataflow.from_numpy(images).write_images(str(tmp_path / "named"), "data", filename_provider=Named(), mode="overwrite")
    assert [p.name for p in _data_files(tmp_path / "named", ".png")] == ["img-0-0.png", "img-0-1.png", "img-0-2.png"]


def test_read_numpy_pickled_objects_only_when_allowed(tmp_path: Path) -> None:
    """Ray's ``read_numpy(allow_pickle=False)`` default refuses object arrays (unpickling runs
    code), naming the file and the way out; ``allow_pickle=True`` reads them as values."""
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}, [1, 2], "x"], dtype=object), allow_pickle=True)
    with pytest.raises(Exception, match=r"objects\.npy.*allow_pickle=True") as info:
        dataflow.read_numpy(str(tmp_path)).take_all()
    assert "Object arrays cannot be loaded" in str(info.value)
    rows = dataflow.read_numpy(str(tmp_path), allow_pickle=True, encoding="latin1").take_all()
    assert [r["data"] for r in rows] == [{"a": 1}, [1, 2], "x"]
    with pytest.raises(TypeError, match="mmap_mode"):
        dataflow.read_numpy(str(tmp_path), mmap_mode="r")
    with pytest.raises(TypeError, match="'encodng'"):
        dataflow.read_numpy(str(tmp_path), encodng="latin1")
