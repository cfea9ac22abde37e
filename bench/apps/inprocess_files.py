"""The in-process limit of offline scoring: read each image file, preprocess, classify; no server, no queue.

    python -m bench.apps.inprocess_files FILE_LIST

FILE_LIST holds one image path per line. Prints JSON {"images", "seconds"} for one pass over the files.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from bench.apps.common import labels, labels_of, preprocess_bytes, session


def main(file_list: str) -> None:
    files = Path(file_list).read_text().split()
    onnx = session()
    name = onnx.get_inputs()[0].name
    names = labels()
    for path in files[:5]:  # warm up
        onnx.run(None, {name: preprocess_bytes(Path(path).read_bytes())})
    started = time.perf_counter()
    for path in files:
        logits = onnx.run(None, {name: preprocess_bytes(Path(path).read_bytes())})[0]
        labels_of(logits, names)
    print(json.dumps({"images": len(files), "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main(sys.argv[1])
