"""A dummy handler for the seed pipeline: it records that node m2 ran and passes the data on."""

from typing import Any


class DummyPythonModel:
    def predict(self, data: Any) -> Any:
        trail = data.get("visited", []) if isinstance(data, dict) else []
        value = data.get("value") if isinstance(data, dict) else data
        return {"value": value, "visited": [*trail, "m2"]}
