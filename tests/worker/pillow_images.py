#!/usr/bin/python3
"""Writes test images in the modes a dataset may hold, each with the RGB bytes Pillow
decodes it to (Image.open(f).convert("RGB")), for image_codec_test: NAME and NAME.rgb
(width, height as two little-endian uint32, then height x width x 3 bytes).

  pillow_images.py OUT_DIR
"""
import os
import struct
import sys

import numpy as np
from PIL import Image


def smooth(rng, h, w, c):
    """A smooth random field plus noise: like a photograph, unlike pure noise."""
    y, x = np.mgrid[0:h, 0:w]
    out = np.zeros((h, w, c), np.float32)
    for k in range(c):
        fx, fy, ph = rng.uniform(0.02, 0.2), rng.uniform(0.02, 0.2), rng.uniform(0, 6)
        out[:, :, k] = 128 + 90 * np.sin(fx * x + ph) * np.cos(fy * y)
    out += rng.normal(0, 12, out.shape)
    return np.clip(out, 0, 255).astype(np.uint8)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(1)
    rgb = Image.fromarray(smooth(rng, 61, 83, 3), "RGB")  # odd sizes: partial MCUs
    grey = Image.fromarray(smooth(rng, 40, 37, 1)[:, :, 0], "L")
    rgba = Image.fromarray(smooth(rng, 30, 50, 4), "RGBA")
    cases = {
        "rgb-420.jpg": (rgb, dict(quality=90)),
        "rgb-444.jpg": (rgb, dict(quality=95, subsampling=0)),
        "rgb-422.jpg": (rgb, dict(quality=75, subsampling=1)),
        "rgb-progressive.jpg": (rgb, dict(quality=85, progressive=True)),
        "rgb-optimized.jpg": (rgb, dict(quality=60, optimize=True)),
        "grey.jpg": (grey, dict(quality=90)),
        "rgb.png": (rgb, {}),
        "rgb-interlaced.png": (rgb, dict(interlace=1)),  # Pillow writes Adam7 when asked
        "grey.png": (grey, {}),
        "rgba.png": (rgba, {}),
        "grey-alpha.png": (rgba.convert("LA"), {}),
        "palette.png": (rgb.convert("P", palette=Image.ADAPTIVE, colors=37), {}),
        "palette-transparent.png": (rgb.convert("P", palette=Image.ADAPTIVE, colors=16),
                                    dict(transparency=3)),
        "bilevel.png": (grey.convert("1"), {}),
        "grey-16.png": (Image.fromarray((smooth(rng, 20, 21, 1)[:, :, 0].astype(np.uint16)
                                          * 257 + 3).astype(np.uint16)), {}),
        "rgb-upper.JPEG": (rgb, dict(quality=90, format="JPEG")),
    }
    for name, (img, opts) in cases.items():
        path = os.path.join(out, name)
        img.save(path, **opts)
        with Image.open(path) as f:
            decoded = np.asarray(f.convert("RGB"))
        h, w, _ = decoded.shape
        with open(path + ".rgb", "wb") as f:
            f.write(struct.pack("<II", w, h))
            f.write(decoded.tobytes())
    # torchvision's eval transform on PIL, Resize(40) then CenterCrop(32), as bytes
    # (ToTensor and Normalize aside): what EvalTransform must reproduce.
    for name in ("rgb.png", "grey.png", "rgb-444.jpg"):
        with Image.open(os.path.join(out, name)) as f:
            img = f.convert("RGB")
        w, h = img.size
        rw, rh = (40, int(40 * h / w)) if w <= h else (int(40 * w / h), 40)
        resized = img.resize((rw, rh), Image.BILINEAR)
        top, left = int(round((rh - 32) / 2.0)), int(round((rw - 32) / 2.0))
        crop = np.asarray(resized.crop((left, top, left + 32, top + 32)))
        with open(os.path.join(out, name + ".eval-40-32"), "wb") as f:
            f.write(crop.tobytes())
    # torchvision's resized_crop on PIL: crop (left 11, top 5, 50 x 40), then resize to
    # 16 x 16 (bilinear): what ResizedCrop must reproduce, the crop's edges included.
    for name in ("rgb.png", "rgb-444.jpg"):
        with Image.open(os.path.join(out, name)) as f:
            img = f.convert("RGB")
        cut = np.asarray(img.crop((11, 5, 61, 45)).resize((16, 16), Image.BILINEAR))
        with open(os.path.join(out, name + ".crop-16"), "wb") as f:
            f.write(cut.tobytes())
    # A CMYK JPEG: refused, not mis-decoded.
    rgb.convert("CMYK").save(os.path.join(out, "cmyk.jpg.bad"), format="JPEG")


if __name__ == "__main__":
    main()
