"""Files read over HTTP (fsspec's http filesystem): its paths are whole URLs, which the
reader must hand over as they are and report as they were given."""

from __future__ import annotations

import dataflow


def test_read_text_and_binary_files_over_http(http_folder):
    folder, base = http_folder
    (folder / "a.txt").write_text("hello\nworld\n")
    (folder / "b.bin").write_bytes(b"\x00\x01")
    assert dataflow.read_text(f"{base}/a.txt").take_all() == [{"text": "hello"}, {"text": "world"}]
    rows = dataflow.read_binary_files([f"{base}/a.txt", f"{base}/b.bin"], include_paths=True).take_all()
    assert sorted((r["path"], r["bytes"]) for r in rows) == [
        (f"{base}/a.txt", b"hello\nworld\n"), (f"{base}/b.bin", b"\x00\x01")]
