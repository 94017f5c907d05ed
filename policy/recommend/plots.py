"""Small PNG charts drawn with Pillow (matplotlib is not a dependency)."""

from __future__ import annotations

from pathlib import Path

WIDTH, HEIGHT, MARGIN = 640, 400, 60
COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40))


def line_chart(path: Path, series: dict, title: str, x_label: str, y_label: str) -> Path:
    """``series``: name -> [(x, y), ...]; one coloured line per name with a legend."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    points = [p for values in series.values() for p in values]
    xs, ys = [p[0] for p in points] or [0, 1], [p[1] for p in points] or [0, 1]
    scale = _scaler(min(xs), max(xs), min(ys), max(ys))
    _axes(draw, title, x_label, y_label, min(xs), max(xs), min(ys), max(ys))
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        pixels = [scale(x, y) for x, y in sorted(values)]
        if len(pixels) > 1:
            draw.line(pixels, fill=colour, width=2)
        for px, py in pixels:
            draw.ellipse((px - 3, py - 3, px + 3, py + 3), fill=colour)
        draw.text((WIDTH - 200, MARGIN + 14 * i), f"- {name}", fill=colour)
    image.save(path)
    return path


def bar_chart(path: Path, bars: dict, title: str, y_label: str) -> Path:
    """``bars``: label -> value (>= 0)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    top = max(list(bars.values()) + [1e-12])
    _axes(draw, title, "", y_label, 0, len(bars), 0, top)
    slot = (WIDTH - 2 * MARGIN) / max(len(bars), 1)
    for i, (label, value) in enumerate(bars.items()):
        x0 = MARGIN + i * slot + slot * 0.2
        y0 = HEIGHT - MARGIN - (HEIGHT - 2 * MARGIN) * value / top
        draw.rectangle((x0, y0, x0 + slot * 0.6, HEIGHT - MARGIN), fill=COLOURS[i % 4])
        draw.text((x0, HEIGHT - MARGIN + 6), label[:22], fill="black")
        draw.text((x0, y0 - 12), f"{value:.4g}", fill="black")
    image.save(path)
    return path


def _scaler(x0, x1, y0, y1):
    dx, dy = (x1 - x0) or 1.0, (y1 - y0) or 1.0

    def scale(x, y):
        return (MARGIN + (x - x0) / dx * (WIDTH - 2 * MARGIN),
                HEIGHT - MARGIN - (y - y0) / dy * (HEIGHT - 2 * MARGIN))
    return scale


def _axes(draw, title, x_label, y_label, x0, x1, y0, y1) -> None:
    draw.text((MARGIN, 15), title, fill="black")
    draw.line((MARGIN, HEIGHT - MARGIN, WIDTH - MARGIN, HEIGHT - MARGIN), fill="black")
    draw.line((MARGIN, MARGIN, MARGIN, HEIGHT - MARGIN), fill="black")
    draw.text((WIDTH // 2 - 40, HEIGHT - 25), x_label, fill="black")
    draw.text((5, MARGIN - 20), y_label, fill="black")
    draw.text((5, HEIGHT - MARGIN - 6), f"{y0:.3g}", fill="black")
    draw.text((5, MARGIN - 6), f"{y1:.3g}", fill="black")
    if x_label:
        draw.text((MARGIN - 5, HEIGHT - MARGIN + 6), f"{x0:g}", fill="black")
        draw.text((WIDTH - MARGIN - 10, HEIGHT - MARGIN + 6), f"{x1:g}", fill="black")
