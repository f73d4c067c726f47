"""Image bytes -> the processor's float rows, by the same PIL calls transformers makes, in the same order.

transformers reads an image file (a path, a `data:` URI, base64) with `load_image`: `PIL.Image.open`,
`ImageOps.exif_transpose` (the EXIF orientation is applied), `convert("RGB")` (palette, grayscale,
CMYK, 16-bit and alpha images become RGB; alpha is dropped, not blended). The image processor then
runs `convert_to_rgb` (a no-op on RGB, but an RGB image whose `info` still names a transparent
colour is composited onto white), `resize` through PIL (`Image.resize(size, resample)`),
`rescale` (uint8 -> float64 * factor -> float32) and `normalize` ((x - mean) / std in float32).
Calling the same functions with the same arguments gives the same bits: the tests compare against
transformers' `*ImageProcessorPil` classes and measure a max abs difference of 0.0.

An image larger than `MAX_PIXELS` (Pillow's own decompression-bomb threshold) is refused before it
is decoded; bytes PIL cannot decode are an InputError naming the image.
"""

from __future__ import annotations

import functools
import io
import re
import warnings
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageOps

from packtool.errors import InputError

#: Pillow's DecompressionBombWarning threshold (its default `Image.MAX_IMAGE_PIXELS`): ~89.5 M pixels,
#: 268 MB as RGB. Larger images are refused by name, never decoded.
MAX_PIXELS = int(1024 * 1024 * 1024 // 4 // 3)
#: the raster formats PIL may read here. Not EPS (PIL runs Ghostscript on it: a program, not pixels),
#: nor the scientific and legacy formats no image dataset holds; anything else is refused by name.
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "DIB", "TIFF", "AVIF", "JPEG2000", "PPM", "TGA", "ICO", "QOI")
#: PIL resampling filters by the integer transformers' configs store (`PILImageResampling`)
RESAMPLE_NAMES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


def decode(data: bytes, name: str = "image", convert_rgb: bool = True) -> Image.Image:
    """The RGB image transformers' processor works on (see the module docstring)."""
    if not isinstance(data, (bytes, bytearray, memoryview)) or len(data) == 0:
        raise InputError(f"{name} is empty (0 bytes), nothing to decode", hint="point the record at a real image file")
    try:
        with warnings.catch_warnings():  # the size is checked below, by name
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            img: Image.Image = Image.open(io.BytesIO(data), formats=FORMATS)
        width, height = img.size
    except Image.DecompressionBombError as exc:
        raise InputError(
            f"{name} is refused: over the {MAX_PIXELS:,}-pixel limit, a decompression bomb or an absurd size "
            f"({_reason(exc)})",
            hint="downscale the image",
        ) from None
    except Exception as exc:  # PIL raises many kinds on hostile bytes; all mean "not an image"
        raise InputError(
            f"{name} is not a readable image ({_reason(exc)}); formats read: {', '.join(FORMATS)}",
            hint="replace or drop the image",
        ) from None
    if width * height > MAX_PIXELS:
        raise InputError(
            f"{name} is refused: {width}x{height} = {width * height:,} pixels is over the {MAX_PIXELS:,}-pixel limit "
            "(a decompression bomb or an absurd size)",
            hint="downscale the image",
        )
    try:
        with warnings.catch_warnings():  # Pillow's advice on palette transparency: the library never prints
            warnings.simplefilter("ignore", UserWarning)
            img = ImageOps.exif_transpose(img)  # load_image
            img = img.convert("RGB")
            if convert_rgb and ("A" in img.getbands() or img.info.get("transparency") is not None):  # convert_to_rgb
                img = img.convert("RGBA")
                background = Image.new("RGBA", img.size, (255, 255, 255, 255))
                img = Image.alpha_composite(background, img).convert("RGB")
    except Exception as exc:
        raise InputError(f"{name} cannot be decoded ({_reason(exc)})", hint="replace or drop the image") from None
    return img


def _reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    text = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", text)  # PIL names the buffer, not the image
    return text if len(text) <= 120 else text[:117] + "..."


def size_of(data: bytes, name: str = "image", convert_rgb: bool = True) -> tuple[int, int]:
    """(height, width) of the decoded, EXIF-transposed image."""
    img = decode(data, name, convert_rgb)
    return img.height, img.width


def resample_filter(value: int) -> Image.Resampling:
    return Image.Resampling(int(value))


def to_floats(
    img: Image.Image,
    size: tuple[int, int] | None,
    resample: int,
    rescale: float | None,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
) -> np.ndarray:
    """Resize to `size` (height, width) when given, rescale, normalize: float32 [3, H, W] (channels first).

    The resized image is uint8, so rescale + normalize is a function of (channel, value): it is computed
    once per setting for the 3 x 256 inputs by transformers' own expression (`value_table`) and looked
    up here, which gives the same bits as running it over every pixel, several times faster."""
    hwc = resized(img, size, resample)
    table = value_table(rescale, None if mean is None else tuple(mean), None if std is None else tuple(std))
    out = np.empty((3, *hwc.shape[:2]), dtype=np.float32)
    for c in range(3):  # per channel, never per pixel
        np.take(table[c], hwc[:, :, c], out=out[c])
    return out


def resized(img: Image.Image, size: tuple[int, int] | None, resample: int) -> np.ndarray:
    """uint8 [H, W, 3]: the image resized to `size` (height, width) by PIL, as the processor's `resize`."""
    if size is not None:
        img = img.resize((size[1], size[0]), resample=resample_filter(resample), reducing_gap=None)
    hwc = np.asarray(img)
    if hwc.dtype != np.uint8 or hwc.ndim != 3 or hwc.shape[2] != 3:
        raise ValueError(f"expected an RGB uint8 image, got {hwc.dtype} {hwc.shape}, this is a bug")
    return hwc


@functools.lru_cache(maxsize=32)
def value_table(rescale: float | None, mean: tuple[float, ...] | None, std: tuple[float, ...] | None) -> np.ndarray:
    """float32 [3, 256]: what `rescale` then `normalize` (transformers' `image_transforms`) give each uint8
    value of each channel, by the same expressions in the same dtypes."""
    values: np.ndarray = np.broadcast_to(np.arange(256, dtype=np.uint8), (3, 256))  # [C, 256]: channels first
    if rescale is not None:
        values = (values.astype(np.float64) * rescale).astype(np.float32)  # image_transforms.rescale
    if mean is not None and std is not None:  # image_transforms.normalize, channels first
        if not np.issubdtype(values.dtype, np.floating):
            values = values.astype(np.float32)
        m = np.array(mean, dtype=values.dtype)
        s = np.array(std, dtype=values.dtype)
        values = ((values.T - m) / s).T
    table = np.ascontiguousarray(values, dtype=np.float32)
    table.setflags(write=False)
    return table
