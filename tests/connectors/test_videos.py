"""read_videos: a row per frame with Ray Data's columns (``frame``, ``frame_index``,
``frame_timestamp``), ``fps`` keeping every n-th frame, ``resize``, files streamed frame by
frame, and a file that is not a video named in the error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from connectors.errors import FileFormatError
from connectors.video_format import VideoDatasource

av = pytest.importorskip("av")


def _write(path: Path, frames: int, rate: int = 24, size: tuple[int, int] = (48, 64)) -> None:
    """A video whose frame ``i`` is one flat grey of level ``16 * i`` (mod 256): a lossy codec
    moves it by a few levels, far less than the step between frames."""
    path.parent.mkdir(parents=True, exist_ok=True)
    height, width = size
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("mpeg4", rate=rate)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(frames):
            image = np.full((height, width, 3), (16 * i) % 256, dtype=np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")))
        container.mux(stream.encode())


def _level(frame: np.ndarray) -> float:
    return float(frame.mean())


def test_frames_become_rows_with_their_index_and_timestamps(tmp_path: Path, mode: str) -> None:
    _write(tmp_path / "v" / "a.mp4", 30)
    _write(tmp_path / "v" / "b.mkv", 10, size=(32, 32))
    ds = dataflow.read_videos(str(tmp_path / "v"), include_timestamps=True, include_paths=True)
    rows = sorted(ds.take_all(), key=lambda r: (r["path"], r["frame_index"]))
    a = [r for r in rows if r["path"].endswith("a.mp4")]
    b = [r for r in rows if r["path"].endswith("b.mkv")]
    assert [r["frame_index"] for r in a] == list(range(30)) and len(b) == 10
    assert a[0]["frame"].shape == (48, 64, 3) and a[0]["frame"].dtype == np.uint8 and b[0]["frame"].shape == (32, 32, 3)
    assert all(abs(_level(r["frame"]) - (16 * r["frame_index"]) % 256) < 7 for r in a)  # each frame is its own picture
    assert a[3]["frame_timestamp"].dtype == np.float32
    np.testing.assert_allclose(a[3]["frame_timestamp"], [3 / 24, 4 / 24], atol=1e-4)
    schema = ds.schema()
    assert dict(zip(schema.names, schema.types, strict=True))["frame_index"] == pa.int64()


def test_fps_keeps_every_nth_frame_and_resize_scales_them(tmp_path: Path, mode: str) -> None:
    _write(tmp_path / "clip.mp4", 24, rate=24)
    rows = dataflow.read_videos(str(tmp_path / "clip.mp4"), fps=6, resize=(24, 16)).take_all()
    assert sorted(r["frame_index"] for r in rows) == [0, 4, 8, 12, 16, 20]  # 24 fps to 6: every 4th
    assert {r["frame"].shape for r in rows} == {(24, 16, 3)}
    assert "frame_timestamp" not in rows[0]
    batch = dataflow.read_videos(str(tmp_path / "clip.mp4")).take_batch(24)
    assert batch["frame"].shape == (24, 48, 64, 3)  # one file's frames: one tensor


def test_arguments_are_checked_as_ray_checks_them(tmp_path: Path) -> None:
    _write(tmp_path / "c.mp4", 2)
    with pytest.raises(ValueError, match="`fps` to be a positive integer"):
        dataflow.read_videos(str(tmp_path), fps=0)
    with pytest.raises(ValueError, match="`resize` to contain two integers"):
        dataflow.read_videos(str(tmp_path), resize=(10,))
    with pytest.raises(ValueError, match="positive integers"):
        VideoDatasource(str(tmp_path), resize=(0, 10))


def test_a_file_that_is_not_a_video_names_the_file(tmp_path: Path, mode: str) -> None:
    (tmp_path / "broken.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"\x01" * 200)
    with pytest.raises(FileFormatError, match=r"broken\.mp4.*not a readable video"):
        dataflow.read_videos(str(tmp_path)).take_all()
