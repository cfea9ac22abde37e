"""Each runtime on a tiny real model built in a fixture: load, signature from the artifact, a batch."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeserve.errors import SpecError
from pipeserve.runtimes import RuntimeOptions, create_runtime

ROWS = np.array([[0.1, 0.2, 0.3, 0.4], [1.0, 0.5, 0.2, 0.1], [0.0, 1.0, 0.0, 1.0]], dtype=np.float32)


def _script(module: Any) -> Any:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.13 deprecates TorchScript in favour of export
        return torch.jit.script(module)


@pytest.fixture(scope="module")
def tiny_sklearn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    import joblib
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    features = rng.normal(size=(20, 4)).astype(np.float32)
    labels = (features[:, 0] + features[:, 1] > 0).astype(np.int64)
    model = LogisticRegression().fit(features, labels)
    path = tmp_path_factory.mktemp("sk") / "model.joblib"
    joblib.dump(model, path)
    return model, path


def test_onnx_runtime(tiny_sklearn: tuple[Any, Path], tmp_path: Path) -> None:
    from skl2onnx import convert_sklearn
    from skl2onnx.common.data_types import FloatTensorType

    model, _ = tiny_sklearn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = convert_sklearn(
            model,
            initial_types=[("x", FloatTensorType([None, 4]))],
            options={id(model): {"zipmap": False}},
            target_opset=17,
        )
    path = tmp_path / "tiny.onnx"
    path.write_bytes(onx.SerializeToString())
    runtime = create_runtime("onnx", RuntimeOptions(artifact=path, intra_op_threads=2))
    runtime.load()
    signature = runtime.signature
    assert [(s.name, s.dtype, s.shape) for s in signature.inputs] == [("x", "float32", (-1, 4))]
    assert signature.output_names() == ["label", "probabilities"]
    out = runtime.predict({"x": ROWS})
    np.testing.assert_allclose(out["probabilities"], model.predict_proba(ROWS), atol=1e-5)
    assert out["label"].tolist() == model.predict(ROWS).tolist()
    assert runtime.describe()["runtime"] == "onnx"


def test_onnx_runtime_refuses_a_file_that_is_not_onnx(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(SpecError, match="onnxruntime cannot load"):
        create_runtime("onnx", RuntimeOptions(artifact=path)).load()


def test_sklearn_runtime(tiny_sklearn: tuple[Any, Path]) -> None:
    model, path = tiny_sklearn
    runtime = create_runtime("sklearn", RuntimeOptions(artifact=path))
    runtime.load()
    assert runtime.signature.inputs[0].shape == (-1, 4)
    assert runtime.signature.output_names() == ["label", "probabilities"]
    out = runtime.predict({"input": ROWS})
    np.testing.assert_allclose(out["probabilities"], model.predict_proba(ROWS), rtol=1e-6)


def test_torchscript_runtime(tmp_path: Path) -> None:
    import torch

    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 2).eval()
    path = tmp_path / "linear.pt"
    _script(linear).save(str(path))
    runtime = create_runtime(
        "torchscript",
        RuntimeOptions(
            artifact=path,
            extra={
                "inputs": [{"name": "features", "dtype": "float32", "shape": [-1, 4]}],
                "outputs": [{"name": "scores", "dtype": "float32", "shape": [-1, 2]}],
            },
        ),
    )
    runtime.load()
    assert runtime.signature.inputs[0].name == "features"
    out = runtime.predict({"features": ROWS})
    with torch.no_grad():
        expected = linear(torch.from_numpy(ROWS)).numpy()
    np.testing.assert_allclose(out["scores"], expected, rtol=1e-6)


def test_torchscript_without_declared_outputs_uses_triton_names(tmp_path: Path) -> None:
    import torch

    path = tmp_path / "relu.pt"
    _script(torch.nn.ReLU()).save(str(path))
    runtime = create_runtime("torchscript", RuntimeOptions(artifact=path))
    runtime.load()
    assert runtime.signature.output_names() == ["output__0"]
    assert runtime.predict({runtime.signature.inputs[0].name: -ROWS})["output__0"].max() == 0


def test_torchscript_refuses_cuda_when_absent(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is present here")
    path = tmp_path / "relu.pt"
    _script(torch.nn.ReLU()).save(str(path))
    with pytest.raises(SpecError, match="CUDA is not available"):
        create_runtime("torchscript", RuntimeOptions(artifact=path, device="cuda:0")).load()


def test_python_runtime(tmp_path: Path) -> None:
    (tmp_path / "mymodel.py").write_text(
        "import numpy as np\n"
        "class Doubler:\n"
        "    def load(self, artifact):\n        self.factor = float(artifact.read_text())\n"
        "    def predict(self, inputs):\n        return {'output': inputs['input'] * self.factor}\n"
    )
    (tmp_path / "factor.txt").write_text("2.5")
    runtime = create_runtime(
        "python",
        RuntimeOptions(artifact=tmp_path / "factor.txt", base_dir=tmp_path, extra={"class": "mymodel:Doubler"}),
    )
    runtime.load()
    np.testing.assert_allclose(runtime.predict({"input": ROWS})["output"], ROWS * 2.5)


def test_unknown_runtime_lists_the_known_ones() -> None:
    with pytest.raises(SpecError, match="onnx, python, sklearn, torchscript"):
        create_runtime("tensorflow", RuntimeOptions(artifact=None))
