"""Image steps on small in-memory images: decode, resize, centre crop, normalize."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from pipeserve.errors import InvalidInput
from pipeserve.pipeline.steps import StepContext, create_step

CONTEXT = StepContext(node="pre", base_dir=Path("."))


def step(name: str, **params: Any) -> Any:
    """The step, typed loosely so tests can call it with step-specific arguments."""
    return create_step(name, params, CONTEXT)


def encode(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def coordinate_image(width: int, height: int) -> Image.Image:
    """Pixel (x, y) holds (x, y, 7), so a crop's origin can be read off its first pixel."""
    array = np.zeros((height, width, 3), dtype=np.uint8)
    array[..., 0] = np.arange(width)[None, :]
    array[..., 1] = np.arange(height)[:, None]
    array[..., 2] = 7
    return Image.fromarray(array)


# --- decode --------------------------------------------------------------------------------------------------


def test_decode_png_bytes():
    image = step("image.decode")(encode(Image.new("RGB", (5, 3), (10, 20, 30))))

    assert image.size == (5, 3)
    assert image.mode == "RGB"
    assert image.getpixel((4, 2)) == (10, 20, 30)


def test_decode_converts_to_rgb():
    rgba = Image.new("RGBA", (2, 2), (200, 100, 50, 128))

    image = step("image.decode")(encode(rgba))

    assert image.mode == "RGB"
    assert image.getpixel((0, 0)) == (200, 100, 50)


def test_decode_to_grayscale():
    image = step("image.decode", mode="L")(encode(Image.new("RGB", (2, 2), (255, 255, 255))))

    assert image.mode == "L"
    assert image.getpixel((1, 1)) == 255


def test_decode_jpeg_and_memoryview():
    data = encode(Image.new("RGB", (16, 8), (0, 128, 255)), fmt="JPEG")

    image = step("image.decode")(memoryview(data))

    assert image.size == (16, 8)


@pytest.mark.parametrize(
    "data",
    [b"this is not an image at all", b"\x89PNG\r\n\x1a\n" + b"\x00" * 20],
    ids=["text", "png-header-only"],
)
def test_decode_non_image_bytes(data):
    with pytest.raises(InvalidInput) as info:
        step("image.decode")(data)

    assert "not a decodable image" in info.value.problem
    assert info.value.expected is not None
    assert "PNG" in info.value.expected


def test_decode_truncated_image():
    data = encode(coordinate_image(64, 64))

    with pytest.raises(InvalidInput, match="not a decodable image"):
        step("image.decode")(data[: len(data) // 2])


def test_decode_empty_bytes():
    with pytest.raises(InvalidInput, match="empty"):
        step("image.decode")(b"")


def test_decode_needs_bytes():
    with pytest.raises(InvalidInput, match="str") as info:
        step("image.decode")("aGVsbG8=")

    assert info.value.expected is not None
    assert "bytes" in info.value.expected


def test_decode_refuses_images_over_max_pixels():
    data = encode(Image.new("RGB", (10, 10)))

    with pytest.raises(InvalidInput, match="10x10") as info:
        step("image.decode", max_pixels=99)(data)

    assert info.value.expected == "at most 99 pixels"
    assert step("image.decode", max_pixels=100)(data).size == (10, 10)


# --- resize --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "resized"),
    [((400, 200), (200, 100)), ((200, 400), (100, 200)), ((300, 300), (100, 100)), ((50, 30), (167, 100))],
    ids=["landscape", "portrait", "square", "upscale"],
)
def test_resize_short_side_keeps_aspect_ratio(size, resized):
    assert step("image.resize", short_side=100)(Image.new("RGB", size)).size == resized


def test_resize_to_an_exact_size():
    assert step("image.resize", size=[30, 20])(Image.new("RGB", (7, 9))).size == (30, 20)


def test_resize_extreme_aspect_ratios():
    assert step("image.resize", short_side=1)(Image.new("RGB", (1000, 2))).size == (500, 1)
    assert step("image.resize", short_side=2)(Image.new("RGB", (1, 1000))).size == (2, 2000)


def test_resize_keeps_a_flat_colour():
    image = step("image.resize", short_side=4, interpolation="bilinear")(Image.new("RGB", (20, 10), (9, 99, 199)))

    assert image.getpixel((3, 2)) == (9, 99, 199)


# --- centre crop ---------------------------------------------------------------------------------------------


def test_center_crop_square_box():
    cropped = step("image.center_crop", size=4)(coordinate_image(10, 8))

    assert cropped.size == (4, 4)
    assert cropped.getpixel((0, 0)) == (3, 2, 7)  # left = (10 - 4) // 2, top = (8 - 4) // 2
    assert cropped.getpixel((3, 3)) == (6, 5, 7)


def test_center_crop_width_and_height():
    cropped = step("image.center_crop", size=[6, 2])(coordinate_image(10, 8))

    assert cropped.size == (6, 2)
    assert cropped.getpixel((0, 0)) == (2, 3, 7)


def test_center_crop_of_the_whole_image():
    cropped = step("image.center_crop", size=[10, 8])(coordinate_image(10, 8))

    assert np.array_equal(np.asarray(cropped), np.asarray(coordinate_image(10, 8)))


def test_center_crop_larger_than_the_image():
    with pytest.raises(InvalidInput, match="10x8") as info:
        step("image.center_crop", size=9)(coordinate_image(10, 8))

    assert info.value.expected == "at least 9x9"


# --- to_tensor -----------------------------------------------------------------------------------------------


def test_to_tensor_keeps_uint8_pixels_channels_first():
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)

    out = step("image.to_tensor")(Image.fromarray(array))

    assert out.shape == (1, 3, 2, 3)
    assert out.dtype == np.uint8
    assert out.flags.c_contiguous
    np.testing.assert_array_equal(out[0], array.transpose(2, 0, 1))


def test_to_tensor_nhwc_and_grayscale():
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)

    np.testing.assert_array_equal(step("image.to_tensor", layout="NHWC")(Image.fromarray(array))[0], array)
    assert step("image.to_tensor")(Image.new("L", (4, 3), 9)).shape == (1, 1, 3, 4)


def test_to_tensor_then_normalize_in_the_model_equals_normalize():
    """The imagenet example's models compute (x - 127) / 128 in their graphs: the same floats as the step."""
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (5, 7, 3), dtype=np.uint8))

    pixels = step("image.to_tensor")(image)

    np.testing.assert_array_equal(
        (pixels.astype(np.float32) - 127.0) / 128.0, step("image.normalize", mean=127.0, std=128.0)(image)
    )


# --- normalize -----------------------------------------------------------------------------------------------


def test_normalize_mean_127_std_128_on_known_pixels():
    array = np.array([[[0, 127, 255], [255, 255, 255]]], dtype=np.uint8)  # 1 x 2 pixels

    out = step("image.normalize", mean=127.0, std=128.0)(Image.fromarray(array))

    assert out.shape == (1, 3, 1, 2)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[0, :, 0, 0], [-127 / 128, 0.0, 1.0], rtol=0, atol=1e-7)
    np.testing.assert_allclose(out[0, :, 0, 1], [1.0, 1.0, 1.0], rtol=0, atol=1e-7)


def test_normalize_nhwc_layout():
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)

    out = step("image.normalize", layout="NHWC")(Image.fromarray(array))

    assert out.shape == (1, 2, 3, 3)
    np.testing.assert_array_equal(out[0], array.astype(np.float32))


def test_normalize_nchw_moves_channels_first():
    array = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)

    out = step("image.normalize")(Image.fromarray(array))

    np.testing.assert_array_equal(out[0], array.transpose(2, 0, 1).astype(np.float32))
    assert out.flags.c_contiguous


def test_normalize_per_channel_mean_and_std_with_scale():
    image = Image.new("RGB", (1, 1), (255, 0, 51))

    out = step("image.normalize", scale=1 / 255, mean=[0.5, 0.0, 0.1], std=[0.5, 1.0, 0.2])(image)

    np.testing.assert_allclose(out[0, :, 0, 0], [1.0, 0.0, 0.5], atol=1e-6)


def test_normalize_grayscale_has_one_channel():
    out = step("image.normalize")(Image.new("L", (4, 3), 9))

    assert out.shape == (1, 1, 3, 4)
    assert float(out.max()) == 9.0


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_normalize_output_dtype(dtype):
    assert step("image.normalize", dtype=dtype)(Image.new("RGB", (1, 1))).dtype == np.dtype(dtype)


def test_preprocessing_chain_from_png_bytes():
    data = encode(Image.new("RGB", (320, 240), (127, 255, 0)))
    value: Any = data
    chain: list[tuple[str, dict[str, Any]]] = [
        ("image.decode", {}),
        ("image.resize", {"short_side": 256}),
        ("image.center_crop", {"size": 224}),
        ("image.normalize", {"mean": 127.0, "std": 128.0}),
    ]
    for name, params in chain:
        value = step(name, **params)(value)

    assert value.shape == (1, 3, 224, 224)
    np.testing.assert_allclose(value[0, :, 100, 100], [0.0, 1.0, -127 / 128], atol=1e-6)
