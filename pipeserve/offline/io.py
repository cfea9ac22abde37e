"""Offline inputs and outputs: records from a folder of images, a CSV, JSONL or Parquet file; resumable JSONL out.

A record is one request: a ``key`` (the file's path in the folder, the ``--id-column`` value, or the row number)
and the ``data`` that ``/predict`` would take. Results are one JSON line per record, ``{"key": ..., "prediction":
...}`` with the prediction encoded exactly as ``/predict`` encodes it; records that fail go to an errors file,
``{"key": ..., "error": ...}``. A rerun reads both files and skips every key already there.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from pipeserve.errors import InvalidInput, SpecError

InputFormat = Literal["images", "csv", "jsonl", "parquet"]
InputKind = Literal["json", "tensor", "image"]
FORMATS: dict[str, InputFormat] = {
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


@dataclass(frozen=True, slots=True)
class Record:
    """One request of an offline run. ``problem`` is set when the input itself could not be read (the record
    goes straight to the errors file); ``path`` marks image data still on disk (read where it is scored)."""

    key: str
    data: Any
    problem: str | None = None
    path: str | None = None


@dataclass(frozen=True, slots=True)
class InputOptions:
    """How to turn rows into requests.

    Attributes:
        columns: the columns whose values make a tensor row (default: every column but ``id_column``).
        id_column: the column (or JSONL field) whose value is a record's key (default: the row number).
        image_column: for image pipelines fed from a table: the column holding image paths (relative to the
            table's folder).
    """

    columns: tuple[str, ...] | None = None
    id_column: str | None = None
    image_column: str | None = None


def detect_format(path: Path) -> InputFormat:
    """The input's format from what it is: a folder holds images; files go by their extension.

    Raises:
        SpecError: an unknown extension or a missing path.
    """
    if path.is_dir():
        return "images"
    if not path.exists():
        raise SpecError(f"input {path} does not exist")
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise SpecError(
            f"input {path}: cannot tell its format from {path.suffix!r}; use a folder of images, or a "
            f"{', '.join(sorted(FORMATS))} file"
        )
    return fmt


def count_records(path: Path, fmt: InputFormat) -> int | None:
    """How many records the input holds (for the progress bar), cheaply; ``None`` if unknown."""
    if fmt == "images":
        return sum(1 for _ in _image_files(path))
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    with path.open("rb") as file:
        lines = sum(1 for line in file if line.strip())
    return max(0, lines - 1) if fmt == "csv" else lines


def read_records(path: Path, fmt: InputFormat, kind: InputKind, options: InputOptions) -> Iterator[Record]:
    """The input's records, in input order, streamed (a file is never loaded whole)."""
    if fmt == "images":
        if kind != "image":
            raise SpecError(f"input {path} is a folder of images, but this pipeline takes {kind} data")
        for file in _image_files(path):
            key = file.relative_to(path).as_posix()
            yield Record(key, None, path=str(file))
        return
    rows = _csv_rows(path) if fmt == "csv" else _parquet_rows(path) if fmt == "parquet" else None
    if rows is not None:
        yield from _table_records(rows, path.parent, kind, options)
        return
    yield from _jsonl_records(path, kind, options)


def load_image(record: Record) -> Record:
    """A record whose image is still a path, with the file's bytes as its data (or the reason it has none)."""
    if record.path is None:
        return record
    try:
        return Record(record.key, Path(record.path).read_bytes())
    except OSError as exc:
        return Record(record.key, None, problem=f"cannot read {record.path}: {exc.strerror or exc}")


def _image_files(folder: Path) -> Iterator[Path]:
    """Every non-hidden file under ``folder``, sorted by its path in it (a stray non-image is reported, not
    silently skipped)."""
    found: list[Path] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found.extend(Path(root) / name for name in files if not name.startswith("."))
    yield from sorted(found, key=lambda path: path.relative_to(folder).as_posix())


def _csv_rows(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(newline="", encoding="utf-8") as file:
        yield from csv.DictReader(file)


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    import pyarrow.parquet as pq

    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        yield from batch.to_pylist()


def _table_records(
    rows: Iterable[dict[str, Any]], base: Path, kind: InputKind, options: InputOptions
) -> Iterator[Record]:
    columns = options.columns
    for number, row in enumerate(rows, start=1):
        key = str(row.get(options.id_column)) if options.id_column else str(number)
        if options.id_column and options.id_column not in row:
            raise SpecError(f"--id-column {options.id_column!r} is not a column (columns: {', '.join(row)})")
        if kind == "image":
            column = options.image_column
            if column is None or column not in row:
                raise SpecError(
                    f"an image pipeline fed from a table needs --image-column naming the column of image paths "
                    f"(columns: {', '.join(row)})"
                )
            yield Record(key, None, path=str(base / str(row[column])))
        elif kind == "tensor":
            names = list(columns) if columns else [name for name in row if name != options.id_column]
            missing = [name for name in names if name not in row]
            if missing:
                raise SpecError(f"--columns {missing} are not columns (columns: {', '.join(row)})")
            try:
                yield Record(key, [[_number(row[name], name) for name in names]])
            except InvalidInput as exc:
                yield Record(key, None, problem=str(exc))
        else:
            yield Record(key, {name: row[name] for name in (columns or row) if name != options.id_column})


def _number(value: Any, column: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(value)
    except (TypeError, ValueError):
        raise InvalidInput(f"column {column!r} is {str(value)[:40]!r}", expected="a number") from None


def _jsonl_records(path: Path, kind: InputKind, options: InputOptions) -> Iterator[Record]:
    id_field = options.id_column or "id"
    with path.open("rb") as file:
        number = 0
        for line in file:
            if not line.strip():
                continue
            number += 1
            try:
                document = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                yield Record(str(number), None, problem=f"line {number} is not JSON: {exc}")
                continue
            if isinstance(document, dict) and "data" in document:
                key = str(document.get(id_field, number))
                yield Record(key, document["data"])
            elif kind == "json":
                yield Record(str(number), document)
            else:
                yield Record(str(number), None, problem=f'line {number} has no "data" field')


class ResultWriter:
    """Appends result and error lines, flushed to disk after every chunk, so that an interrupted run keeps all
    it wrote; on a rerun, ``done`` holds the keys already in either file (a torn last line is cut off first).

    Example:
        >>> writer = ResultWriter(Path("out.jsonl"))   # doctest: +SKIP
        >>> writer.write_result("a.jpg", b'"tabby"'); writer.flush()  # doctest: +SKIP
    """

    def __init__(self, output: Path, errors: Path | None = None) -> None:
        if output.suffix.lower() not in (".jsonl", ".ndjson"):
            raise SpecError(f"--output {output}: results are JSON lines; name the file *.jsonl")
        self.output = output
        self.errors = errors or output.with_name(output.stem + ".errors.jsonl")
        output.parent.mkdir(parents=True, exist_ok=True)
        self.done: set[str] = set()
        self.resumed = {"results": self._resume(self.output), "errors": self._resume(self.errors)}
        self._out = self.output.open("ab")
        self._err = self.errors.open("ab")
        self.written = 0
        self.failed = 0

    def _resume(self, path: Path) -> int:
        if not path.exists():
            return 0
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):  # a line cut off by the interruption: drop it, its record is redone
            with path.open("r+b") as file:
                file.truncate(keep)
        found = 0
        for line in io.BytesIO(data[:keep]):
            try:
                self.done.add(str(orjson.loads(line)["key"]))
                found += 1
            except (orjson.JSONDecodeError, KeyError, TypeError):
                continue
        return found

    def write_result(self, key: str, prediction: bytes) -> None:
        self._out.write(orjson.dumps({"key": key})[:-1] + b',"prediction":' + prediction + b"}\n")
        self.written += 1

    def write_error(self, key: str, error: str) -> None:
        self._err.write(orjson.dumps({"key": key, "error": error}) + b"\n")
        self.failed += 1

    def flush(self) -> None:
        for file in (self._out, self._err):
            file.flush()
            os.fsync(file.fileno())

    def close(self) -> None:
        self.flush()
        self._out.close()
        self._err.close()
