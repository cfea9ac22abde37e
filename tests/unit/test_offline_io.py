from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from pipeserve.errors import SpecError
from pipeserve.offline.io import InputOptions, ResultWriter, count_records, detect_format, load_image, read_records


def test_formats_come_from_what_the_input_is(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x\n1\n")
    (tmp_path / "b.jsonl").write_text("{}\n")
    (tmp_path / "c.parquet").write_bytes(b"")
    assert detect_format(tmp_path) == "images"
    assert detect_format(tmp_path / "a.csv") == "csv"
    assert detect_format(tmp_path / "b.jsonl") == "jsonl"
    assert detect_format(tmp_path / "c.parquet") == "parquet"
    (tmp_path / "d.xlsx").write_bytes(b"")
    with pytest.raises(SpecError, match="cannot tell its format"):
        detect_format(tmp_path / "d.xlsx")


def test_csv_rows_become_tensor_rows_keyed_by_the_id_column(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("id,a,b\nfirst,1,2.5\nsecond,3,x\n")
    records = list(read_records(path, "csv", "tensor", InputOptions(id_column="id")))
    assert [(r.key, r.data, r.problem) for r in records] == [
        ("first", [[1.0, 2.5]], None),
        ("second", None, "column 'b' is 'x'; expected a number"),
    ]
    assert count_records(path, "csv") == 2
    chosen = list(read_records(path, "csv", "tensor", InputOptions(columns=("a",))))
    assert [(r.key, r.data) for r in chosen] == [("1", [[1.0]]), ("2", [[3.0]])]


def test_unknown_columns_are_named(tmp_path: Path) -> None:
    path = tmp_path / "rows.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(SpecError, match="not columns"):
        list(read_records(path, "csv", "tensor", InputOptions(columns=("c",))))
    with pytest.raises(SpecError, match="--id-column 'id'"):
        list(read_records(path, "csv", "tensor", InputOptions(id_column="id")))


def test_parquet_rows_read_like_csv(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "x": [1.0, 2.0], "y": [3, 4]}), path)
    records = list(read_records(path, "parquet", "tensor", InputOptions(id_column="id")))
    assert [(r.key, r.data) for r in records] == [("a", [[1.0, 3.0]]), ("b", [[2.0, 4.0]])]
    assert count_records(path, "parquet") == 2


def test_jsonl_lines_are_predict_bodies_and_bad_lines_are_problems(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text('{"id": "x", "data": [[1, 2]]}\n\n{"data": [[3, 4]]}\nnot json\n{"other": 1}\n')
    records = list(read_records(path, "jsonl", "tensor", InputOptions()))
    assert [(r.key, r.data) for r in records[:2]] == [("x", [[1, 2]]), ("2", [[3, 4]])]
    assert "line 3 is not JSON" in (records[2].problem or "")
    assert records[3].problem == 'line 4 has no "data" field'
    assert count_records(path, "jsonl") == 4


def test_a_folder_yields_every_visible_file_sorted_with_its_relative_path(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.jpg").write_bytes(b"two")
    (tmp_path / "1.png").write_bytes(b"one")
    (tmp_path / ".hidden").write_bytes(b"no")
    records = list(read_records(tmp_path, "images", "image", InputOptions()))
    assert [r.key for r in records] == ["1.png", "b/2.jpg"]
    assert [load_image(r).data for r in records] == [b"one", b"two"]
    with pytest.raises(SpecError, match="folder of images"):
        list(read_records(tmp_path, "images", "tensor", InputOptions()))


def test_the_writer_resumes_cutting_a_torn_last_line(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_bytes(b'{"key":"a","prediction":1}\n{"key":"b","predic')
    (tmp_path / "out.errors.jsonl").write_bytes(b'{"key":"c","error":"bad"}\n')
    writer = ResultWriter(output)
    assert writer.done == {"a", "c"}
    writer.write_result("b", b"[0.5,0.25]")
    writer.write_error("d", "not an image")
    writer.close()
    lines = [orjson.loads(line) for line in output.read_bytes().splitlines()]
    assert lines == [{"key": "a", "prediction": 1}, {"key": "b", "prediction": [0.5, 0.25]}]
    assert orjson.loads((tmp_path / "out.errors.jsonl").read_bytes().splitlines()[-1]) == {
        "key": "d",
        "error": "not an image",
    }


def test_the_output_must_be_json_lines(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"\*\.jsonl"):
        ResultWriter(tmp_path / "out.csv")
