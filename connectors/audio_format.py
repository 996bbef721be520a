"""Audio files decoded with ``soundfile`` (libsndfile; the optional ``audio`` extra), as Ray
Data's ``read_audio``: one row per file, ``amplitude`` a ``float32`` tensor of shape
``(channels, samples)`` and ``sample_rate`` an ``int64``.

A file is read whole (libsndfile decodes from memory, not from a stream) and decoded to
``float32`` in [-1, 1]. Files of different lengths or channel counts go to different blocks
(a block's tensor column has one shape); batched together they become one variable-shape
tensor column (``engine.ragged_tensors``), as images of different sizes do.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import read_file_bytes
from connectors.retry import Retrier

AUDIO_EXTENSIONS = (
    # Ray Data's list; libsndfile reads those of them it has a codec for (WAV, FLAC, OGG/Vorbis
    # and Opus, MP3, AIFF, AU, CAF...), and a file it cannot is an error naming the file
    ".mp3", ".wav", ".aac", ".flac", ".ogg", ".m4a", ".wma", ".alac", ".aiff", ".pcm", ".amr",
    ".opus", ".ra", ".rm", ".au", ".mid", ".midi", ".caf",
)  # fmt: skip


class AudioDatasource(FileDatasource):
    """Audio files as ``amplitude`` tensors and their ``sample_rate``; needs ``soundfile``."""

    FILE_EXTENSIONS = AUDIO_EXTENSIONS

    def __init__(self, paths: Any, **kwargs: Any) -> None:
        try:
            import soundfile  # noqa: F401
        except ImportError as err:
            raise ImportError("read_audio needs soundfile: pip install 'dataflow[audio]' (or soundfile)") from err
        super().__init__(paths, **kwargs)

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        import soundfile

        data = read_file_bytes(fs, piece.entry.path, retrier, display, decompress=False, args=self._stream_args)
        try:
            amplitude, sample_rate = soundfile.read(io.BytesIO(data), always_2d=True, dtype="float32")
        except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError) as exc:
            raise FileFormatError(f"not a readable audio file: {exc}", path=display) from exc
        channels_first = np.ascontiguousarray(amplitude.T)  # (samples, channels) -> (channels, samples), as Ray
        yield pa.table({
            "amplitude": pa.FixedShapeTensorArray.from_numpy_ndarray(channels_first.reshape(1, *channels_first.shape)),
            "sample_rate": pa.array([sample_rate], pa.int64()),
        })
