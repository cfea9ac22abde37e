"""Overload is refused with 503 + Retry-After, never queued without bound, and nobody else is harmed."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SPEC = """
pipeline:
  name: slow
  input: {kind: tensor, shape: [-1, 2]}
  nodes:
  - name: model
    model_load_meta:
      runtime: tests.fakes:SlowRuntime
      artifact: weights.bin
      options: {delay_s: 0.4}
"""


def test_requests_beyond_the_in_flight_limit_get_503(client_factory: Any, tmp_path: Path) -> None:
    (tmp_path / "pipeline.yaml").write_text(SPEC)
    (tmp_path / "weights.bin").write_bytes(b"\0")
    client = client_factory(tmp_path, max_in_flight=2)

    def ask(i: int) -> Any:
        return client.post("/predict", json={"data": [[i, i]]})

    with ThreadPoolExecutor(6) as pool:
        responses = list(pool.map(ask, range(6)))
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 503]
    assert len(ok) >= 2
    assert refused, [r.status_code for r in responses]
    assert all(r.headers["retry-after"] == "1" for r in refused)
    assert all("in flight" in r.json()["error"] for r in refused)
    for response in ok:  # the admitted requests got their own answers
        row = response.json()["prediction"]
        assert row[0] == row[1]
    assert client.post("/predict", json={"data": [[7, 7]]}).json() == {"prediction": [7.0, 7.0]}
