"""HunyuanVideo-1.5's resolution rules: the aspect buckets of a target size (the default resolution, and the size
an image-to-video input is cropped to)."""

from __future__ import annotations

DEFAULT_ASPECT = (9, 16)  # (height, width): the pipeline's default_aspect_ratio (16:9, landscape)


def buckets(target_size: int, multiple: int, max_ratio: float = 4.0) -> list[tuple[int, int]]:
    """(height, width) sizes of about target_size^2 pixels, multiples of `multiple`, aspect within `max_ratio`
    (the pipeline's generate_crop_size_list, walked from the widest first value to the narrowest)."""
    area = round((target_size / multiple) ** 2)
    out, a, b = [], area, 1
    while a > 0:
        if max(a, b) / min(a, b) <= max_ratio:
            out.append((a * multiple, b * multiple))
        if (b + 1) * a <= area:
            b += 1
        else:
            a -= 1
    return out


def closest_bucket(height: float, width: float, target_size: int, multiple: int) -> tuple[int, int]:
    """The bucket whose height / width ratio (rounded to 5 decimals) is nearest to height / width without crossing
    it toward square: at or below it for portrait and square inputs, at or above it for landscape ones."""
    sizes = buckets(target_size, multiple)
    aspect = float(height) / float(width)
    diffs = [round(h / w, 5) - aspect for h, w in sizes]
    allowed = [i for i, d in enumerate(diffs) if (d <= 0 if aspect >= 1 else d >= 0)]
    return sizes[min(allowed, key=lambda i: abs(diffs[i]))]
