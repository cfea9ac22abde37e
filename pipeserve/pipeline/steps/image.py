"""Image steps: decode, resize, centre-crop, to_tensor (uint8 pixels), normalize. Pillow is imported on first use."""

from __future__ import annotations

import io
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import Field, field_validator

from pipeserve.errors import InvalidInput, SpecError
from pipeserve.pipeline.steps.base import Step, StepParams

_IMAGE_FORMATS = "a JPEG, PNG, GIF, BMP, TIFF or WebP image"


def _pil() -> Any:
    from PIL import Image

    return Image


class Decode(Step):
    """Bytes of an encoded image -> an RGB (or ``mode``) Pillow image. Not an image -> ``InvalidInput``."""

    class Params(StepParams):
        mode: Literal["RGB", "L", "RGBA"] = "RGB"
        max_pixels: int = Field(default=50_000_000, ge=1)

    is_cpu_heavy: ClassVar[bool] = True

    def __call__(self, value: Any) -> Any:
        image_mod = _pil()
        params: Decode.Params = self.params  # type: ignore[assignment]
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidInput(f"image data is a {type(value).__name__}", expected=f"{_IMAGE_FORMATS} as bytes")
        if len(value) == 0:
            raise InvalidInput("image data is empty", expected=_IMAGE_FORMATS)
        try:
            image = image_mod.open(io.BytesIO(value))
            width, height = image.size
            if width * height > params.max_pixels:
                raise InvalidInput(f"image is {width}x{height} pixels", expected=f"at most {params.max_pixels} pixels")
            image.load()
            return image.convert(params.mode)
        except InvalidInput:
            raise
        except (OSError, SyntaxError, ValueError, image_mod.DecompressionBombError) as exc:
            head = bytes(value[:8]).hex()
            reason = "not a known image format" if isinstance(exc, image_mod.UnidentifiedImageError) else str(exc)
            raise InvalidInput(
                f"data is not a decodable image ({len(value)} bytes starting {head}: {reason})", expected=_IMAGE_FORMATS
            ) from exc


class Resize(Step):
    """Resize so the short side is ``short_side`` (keeping the aspect ratio), or to exactly ``size`` [w, h]."""

    class Params(StepParams):
        short_side: int | None = Field(default=None, ge=1, le=16384)
        size: tuple[int, int] | None = None
        interpolation: Literal["nearest", "bilinear", "bicubic", "lanczos", "box", "hamming"] = "bicubic"

        @field_validator("size")
        @classmethod
        def _positive(cls, value: tuple[int, int] | None) -> tuple[int, int] | None:
            if value is not None and min(value) < 1:
                raise ValueError("size must be two positive integers [width, height]")
            return value

    is_cpu_heavy: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        params: Resize.Params = self.params  # type: ignore[assignment]
        if (params.short_side is None) == (params.size is None):
            raise ValueError("image.resize needs exactly one of short_side or size")

    def __call__(self, value: Any) -> Any:
        params: Resize.Params = self.params  # type: ignore[assignment]
        resample = getattr(_pil().Resampling, params.interpolation.upper())
        width, height = value.size
        if params.size is not None:
            target = params.size
        else:
            assert params.short_side is not None
            scale = params.short_side / min(width, height)
            target = (max(1, round(width * scale)), max(1, round(height * scale)))
        return value.resize(target, resample)


class CenterCrop(Step):
    """Crop the centre ``size`` x ``size`` (or [w, h]) pixels."""

    class Params(StepParams):
        size: int | tuple[int, int]

        @field_validator("size")
        @classmethod
        def _positive(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
            if min(value if isinstance(value, tuple) else (value,)) < 1:
                raise ValueError("size must be a positive integer or two positive integers [width, height]")
            return value

    is_cpu_heavy: ClassVar[bool] = True

    def __call__(self, value: Any) -> Any:
        params: CenterCrop.Params = self.params  # type: ignore[assignment]
        crop_w, crop_h = (params.size, params.size) if isinstance(params.size, int) else params.size
        width, height = value.size
        if width < crop_w or height < crop_h:
            raise InvalidInput(f"image is {width}x{height} after resizing", expected=f"at least {crop_w}x{crop_h}")
        left, top = (width - crop_w) // 2, (height - crop_h) // 2
        return value.crop((left, top, left + crop_w, top + crop_h))


class ToTensor(Step):
    """Pillow image -> its pixels as a uint8 array laid out NCHW (default) or NHWC, with a batch dim of 1.

    For models that normalize in their own graph: a quarter of a float32 tensor's bytes, and the mean and std
    travel with the model artifact instead of the preprocessing config.
    """

    class Params(StepParams):
        layout: Literal["NCHW", "NHWC"] = "NCHW"

    is_cpu_heavy: ClassVar[bool] = True

    def __call__(self, value: Any) -> Any:
        params: ToTensor.Params = self.params  # type: ignore[assignment]
        array = np.asarray(value, dtype=np.uint8)
        if array.ndim == 2:
            array = array[:, :, None]
        if params.layout == "NCHW":
            array = array.transpose(2, 0, 1)
        return np.ascontiguousarray(array[None])


class Normalize(Step):
    """Pillow image -> float array ``(x - mean) / std``, laid out NCHW (default) or NHWC, with a batch dim of 1."""

    class Params(StepParams):
        mean: float | list[float] = 0.0
        std: float | list[float] = 1.0
        scale: float = Field(default=1.0, gt=0, description="Multiply pixels by this first (1/255 for [0, 1]).")
        layout: Literal["NCHW", "NHWC"] = "NCHW"
        dtype: Literal["float32", "float16", "float64"] = "float32"

    is_cpu_heavy: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        params: Normalize.Params = self.params  # type: ignore[assignment]
        std = np.asarray(params.std, dtype=np.float32)
        if not np.all(std > 0):
            raise SpecError(f"std must be > 0 (it divides), got {params.std}", field="params.std")
        self._mean = np.asarray(params.mean, dtype=np.float32)
        self._inv_std = 1.0 / std

    def __call__(self, value: Any) -> Any:
        params: Normalize.Params = self.params  # type: ignore[assignment]
        array = np.asarray(value, dtype=np.float32)
        if array.ndim == 2:
            array = array[:, :, None]
        if params.scale != 1.0:
            array = array * np.float32(params.scale)
        array = (array - self._mean) * self._inv_std
        if params.layout == "NCHW":
            array = array.transpose(2, 0, 1)
        return np.ascontiguousarray(array[None], dtype=params.dtype)
