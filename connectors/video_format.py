"""Video files decoded frame by frame with PyAV (FFmpeg; the optional ``video`` extra), as Ray
Data's ``read_videos``: one row per frame, ``frame`` a ``uint8`` RGB tensor of shape
``(height, width, 3)`` and ``frame_index`` (``int64``, the frame's number in its file), and
with ``include_timestamps=True`` ``frame_timestamp``, the frame's ``[start, end]`` in seconds
(``float32``, the pair decord's ``get_frame_timestamp`` gives Ray).

``fps=n`` keeps every ``round(source_fps / n)``-th frame (the kept frames keep their own
indices), ``resize=(height, width)`` scales every frame, both as Ray's (which decodes with
decord; the frames are the same RGB pixels up to the decoders' rounding).

A file is opened for random access (containers such as MP4 keep their index at the end) and
decoded as a stream: a task holds about one block of frames, never the whole video. Frames
of one file share a shape, so a block's ``frame`` column is one fixed-shape tensor.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from connectors.errors import FileFormatError
from connectors.file_datasource import FileDatasource, FilePiece
from connectors.filesystem import open_input_file, read_file_bytes
from connectors.retry import Retrier

VIDEO_EXTENSIONS = (
    # Ray Data's list
    ".mp4", ".mkv", ".mov", ".avi", ".wmv", ".flv", ".webm", ".m4v", ".3gp", ".mpeg", ".mpg",
    ".ts", ".ogv", ".rm", ".rmvb", ".vob", ".asf", ".f4v", ".m2ts", ".mts", ".divx", ".xvid", ".mxf",
)  # fmt: skip


class VideoDatasource(FileDatasource):
    """Frames of video files (see the module docstring); needs ``av`` (PyAV)."""

    FILE_EXTENSIONS = VIDEO_EXTENSIONS

    def __init__(
        self,
        paths: Any,
        *,
        include_timestamps: bool = False,
        fps: int | None = None,
        resize: tuple[int, int] | None = None,
        **kwargs: Any,
    ) -> None:
        try:
            import av  # noqa: F401
        except ImportError as err:
            raise ImportError("read_videos needs PyAV: pip install 'dataflow[video]' (or av)") from err
        if fps is not None and (isinstance(fps, bool) or not isinstance(fps, int) or fps <= 0):
            raise ValueError(f"Expected `fps` to be a positive integer, but got {fps} instead.")
        if resize is not None:
            if len(resize) != 2 or not all(isinstance(d, int) for d in resize):
                raise ValueError(f"Expected `resize` to contain two integers for height and width, but got {resize} instead.")
            if min(resize) <= 0:
                raise ValueError(f"Expected `resize` to contain positive integers, but got {resize} instead.")
        super().__init__(paths, **kwargs)
        self._include_timestamps = include_timestamps
        self._fps = fps
        self._resize = tuple(resize) if resize is not None else None

    def _read_file(self, fs: Any, piece: FilePiece, display: str, retrier: Retrier) -> Iterator[pa.Table]:
        import av

        if self._stream_args.compression is not None:  # a compressed file: no random access into it
            source: Any = io.BytesIO(read_file_bytes(fs, piece.entry.path, retrier, display, args=self._stream_args))
        else:
            source = open_input_file(fs, piece.entry.path, retrier, display)
        try:
            with source, av.open(source, mode="r") as container:
                if not container.streams.video:
                    raise FileFormatError("no video stream in the file", path=display)
                stream = container.streams.video[0]
                yield from self._frames(container, stream)
        except av.FFmpegError as exc:
            raise FileFormatError(f"not a readable video: {exc}", path=display) from exc

    def _frames(self, container: Any, stream: Any) -> Iterator[pa.Table]:
        rate = stream.average_rate or stream.guessed_rate
        source_fps = float(rate) if rate else 0.0
        stride = max(1, round(source_fps / self._fps)) if self._fps is not None and source_fps else 1
        for index, frame in enumerate(container.decode(stream)):
            if index % stride:
                continue
            if self._resize is not None:
                height, width = self._resize
                frame = frame.reformat(width=width, height=height)
            image = frame.to_ndarray(format="rgb24")
            columns: dict[str, Any] = {
                "frame": pa.FixedShapeTensorArray.from_numpy_ndarray(image.reshape(1, *image.shape)),
                "frame_index": pa.array([index], pa.int64()),
            }
            if self._include_timestamps:
                start = float(frame.time) if frame.time is not None else (index / source_fps if source_fps else 0.0)
                end = start + (1.0 / source_fps if source_fps else 0.0)
                stamps = np.array([[start, end]], dtype=np.float32)
                columns["frame_timestamp"] = pa.FixedShapeTensorArray.from_numpy_ndarray(stamps)
            yield pa.table(columns)
