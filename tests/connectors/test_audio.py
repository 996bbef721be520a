"""read_audio: a row per file, ``amplitude`` a float32 ``(channels, samples)`` tensor and
``sample_rate`` an int64 (Ray Data's columns), files of different shapes batched together,
partitions and paths, and a file that is not audio named in the error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import dataflow
from connectors.errors import FileFormatError

soundfile = pytest.importorskip("soundfile")


def _tone(seconds: float, rate: int, channels: int, freq: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    wave = 0.5 * np.sin(2 * np.pi * freq * t)
    return np.stack([wave * (c + 1) / channels for c in range(channels)], axis=1).astype(np.float32)


def _write(path: Path, samples: np.ndarray, rate: int, fmt: str, subtype: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    soundfile.write(str(path), samples, rate, format=fmt, subtype=subtype)


def test_files_become_amplitude_tensors_and_sample_rates(tmp_path: Path, mode: str) -> None:
    stereo = _tone(0.25, 16_000, 2)
    mono = _tone(0.1, 8_000, 1, freq=1000.0)
    _write(tmp_path / "clips" / "a.wav", stereo, 16_000, "WAV", "FLOAT")
    _write(tmp_path / "clips" / "b.flac", mono, 8_000, "FLAC")
    (tmp_path / "clips" / "notes.txt").write_text("not audio: left out by extension")
    ds = dataflow.read_audio(str(tmp_path / "clips"), include_paths=True)
    rows = sorted(ds.take_all(), key=lambda r: r["path"])
    assert [Path(r["path"]).name for r in rows] == ["a.wav", "b.flac"]
    a, b = rows
    assert a["sample_rate"] == 16_000 and b["sample_rate"] == 8_000
    assert a["amplitude"].dtype == np.float32 and a["amplitude"].shape == (2, 4_000)  # (channels, samples)
    np.testing.assert_array_equal(a["amplitude"], stereo.T)  # a float WAV is exact
    assert b["amplitude"].shape == (1, 800)
    np.testing.assert_allclose(b["amplitude"][0], mono[:, 0], atol=1e-4)  # FLAC: 16-bit samples
    batch = ds.take_batch(2)  # two shapes in one batch: an object array of arrays, as Ray's
    assert batch["amplitude"].dtype == object and {x.shape for x in batch["amplitude"]} == {(2, 4_000), (1, 800)}
    assert ds.schema().types[list(ds.schema().names).index("sample_rate")] == pa.int64()


def test_same_shaped_clips_batch_into_one_tensor(tmp_path: Path, mode: str) -> None:
    for i in range(4):
        _write(tmp_path / f"year={2020 + i % 2}" / f"{i}.wav", _tone(0.05, 8_000, 1, freq=200.0 * (i + 1)), 8_000, "WAV")
    ds = dataflow.read_audio(str(tmp_path), partitioning="hive")
    batch = ds.take_batch(4)
    assert batch["amplitude"].shape == (4, 1, 400) and batch["amplitude"].dtype == np.float32
    assert sorted(batch["year"].tolist()) == ["2020", "2020", "2021", "2021"]


def test_a_file_that_is_not_audio_names_the_file(tmp_path: Path, mode: str) -> None:
    (tmp_path / "broken.wav").write_bytes(b"RIFF" + b"\x00" * 64)
    with pytest.raises(FileFormatError, match=r"broken\.wav.*not a readable audio file"):
        dataflow.read_audio(str(tmp_path)).take_all()
