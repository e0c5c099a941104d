"""GIMP families: transform a seeded block image and export the result to a new file.

Images are grids of solid colour blocks, so the checkers sample block centres: robust to GIMP's
resampling and JPEG, yet any wrong transform moves a block. The oracle runs GIMP's own batch mode
(Script-Fu), the tooling an agent could also reach from GIMP's Filters > Script-Fu console.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from PIL import Image, ImageOps

from ..actions import HEADLESS_TIMEOUT_S, execute, wait
from ..docfiles import image_bytes
from ..spec import Solution, TaskSpec
from . import content
from .registry import family

PICS = "/home/user/Pictures"
STEMS = ["photo", "tiles", "banner", "swatch", "mosaic", "pattern"]
BLOCK = 16


def _srgb_to_linear(c: float) -> float:
    c /= 255
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def _linear_to_srgb(v: float) -> int:
    s = v * 12.92 if v <= 0.0031308 else 1.055 * v ** (1 / 2.4) - 0.055
    return max(0, min(255, round(s * 255)))


def gray_of(rgb: tuple[int, int, int]) -> int:
    """GIMP 2.10's grayscale conversion: Rec. 709 luminance in linear light."""
    r, g, b = (_srgb_to_linear(c) for c in rgb)
    return _linear_to_srgb(0.2126 * r + 0.7152 * g + 0.0722 * b)


# Palette colours whose grey value is far from mid-grey, so grey and inverted grey differ clearly.
_CANDIDATES = [
    (220, 40, 40),
    (40, 160, 60),
    (30, 60, 200),
    (240, 200, 40),
    (250, 250, 250),
    (20, 20, 20),
    (240, 130, 30),
    (120, 40, 160),
    (60, 200, 220),
    (250, 180, 200),
    (90, 60, 30),
    (200, 230, 120),
    (10, 90, 90),
    (255, 240, 160),
    (60, 20, 60),
    (160, 240, 240),
]
PALETTE = [c for c in _CANDIDATES if abs(gray_of(c) - 128) > 30]


def make_image(rng: random.Random) -> Image.Image:
    cols = rng.randint(4, 6)
    rows = rng.choice([r for r in (3, 4, 5) if r != cols])
    img = Image.new("RGB", (cols * BLOCK, rows * BLOCK))
    prev_row: list[tuple[int, int, int]] = []
    row_colors: list[tuple[int, int, int]] = []
    for y in range(rows):
        row_colors = []
        for x in range(cols):
            banned = {row_colors[-1] if row_colors else None, prev_row[x] if prev_row else None}
            color = rng.choice([c for c in PALETTE if c not in banned])
            row_colors.append(color)
            img.paste(color, (x * BLOCK, y * BLOCK, (x + 1) * BLOCK, (y + 1) * BLOCK))
        prev_row = row_colors
    return img


def samples(img: Image.Image, block: int) -> list[list[int]]:
    """Block centres of the expected image, with their colours."""
    out = []
    for y in range(block // 2, img.height, block):
        for x in range(block // 2, img.width, block):
            px = img.getpixel((x, y))
            px = (px, px, px) if isinstance(px, int) else px
            out.append([x, y, px[0], px[1], px[2]])
    return out


def to_gray(img: Image.Image) -> Image.Image:
    cache: dict = {}
    out = Image.new("L", img.size)
    raw = img.convert("RGB").tobytes()
    pixels = [tuple(raw[i : i + 3]) for i in range(0, len(raw), 3)]
    out.putdata([cache.setdefault(p, gray_of(p)) for p in pixels])
    return out


Op = Callable[[Image.Image], Image.Image]

# name -> (Script-Fu on `img`, the same transform in PIL)
OPS: dict[str, tuple[str, Op]] = {
    "flip_h": ("(gimp-image-flip img ORIENTATION-HORIZONTAL)", ImageOps.mirror),
    "flip_v": ("(gimp-image-flip img ORIENTATION-VERTICAL)", ImageOps.flip),
    "rot_cw": (
        "(gimp-image-rotate img ROTATE-90)",
        lambda i: i.transpose(Image.Transpose.ROTATE_270),
    ),
    "rot_ccw": (
        "(gimp-image-rotate img ROTATE-270)",
        lambda i: i.transpose(Image.Transpose.ROTATE_90),
    ),
    "rot_180": (
        "(gimp-image-rotate img ROTATE-180)",
        lambda i: i.transpose(Image.Transpose.ROTATE_180),
    ),
    "gray": ("(gimp-image-convert-grayscale img)", to_gray),
    "invert": (
        "(gimp-drawable-invert (car (gimp-image-get-active-drawable img)) FALSE)",
        lambda i: ImageOps.invert(i.convert("RGB")),
    ),
    "copy": ("", lambda i: i),
}


def scale_op(w: int, h: int) -> tuple[str, Op]:
    return (f"(gimp-image-scale img {w} {h})", lambda i: i.resize((w, h), Image.Resampling.NEAREST))


def crop_op(w: int, h: int, x: int, y: int) -> tuple[str, Op]:
    return (f"(gimp-image-crop img {w} {h} {x} {y})", lambda i: i.crop((x, y, x + w, y + h)))


def gimp_batch(src: str, dest: str, script: str) -> list:
    sf = (
        f'(let* ((img (car (gimp-file-load RUN-NONINTERACTIVE "{src}" "{src}")))) {script} '
        f"(gimp-file-save RUN-NONINTERACTIVE img (car (gimp-image-get-active-drawable img)) "
        f'"{dest}" "{dest}") (gimp-image-delete img))'
    )
    return [execute(["gimp", "-i", "-b", sf, "-b", "(gimp-quit 0)"], HEADLESS_TIMEOUT_S), wait(1.0)]


def gimp_solution(
    name: str, src: str, dest: str, ops: list[tuple[str, Op]], fmt: str = "PNG", why: str = ""
) -> Solution:
    script = " ".join(s for s, _ in ops)

    def simulate(inputs: dict[str, bytes]) -> dict[str, bytes | None]:
        import io

        img = Image.open(io.BytesIO(inputs[src])).convert("RGB")
        for _, fn in ops:
            img = fn(img)
        if fmt == "JPEG" and img.mode not in ("RGB", "L"):
            img = img.convert("RGB")
        return {dest: image_bytes(img, fmt)}

    return Solution(name, gimp_batch(src, dest, script), simulate, why)


def gimp_spec(
    rng: random.Random,
    instruction: str,
    src: str,
    img: Image.Image,
    out: str,
    expected: Image.Image,
    block: int,
    oracle: Solution,
    near: list[Solution],
    fmt: str = "PNG",
    gray: bool = False,
) -> TaskSpec:
    decoy = f"{PICS}/README.txt"
    options = {
        "file": "out",
        "format": fmt,
        "width": expected.width,
        "height": expected.height,
        "samples": samples(expected, block),
        "tol": 40,
    }
    if gray:
        options["gray"] = True
    return TaskSpec(
        family="",
        app="gimp",
        instruction=instruction,
        files={
            src: image_bytes(img),
            decoy: ("Image drafts.\n" + content.sentence(rng) + "\n").encode(),
        },
        launch=[
            {"type": "launch", "parameters": {"command": ["gimp", src]}},
            {"type": "sleep", "parameters": {"seconds": 6}},
        ],
        results=[(out, "out")],
        check="image_pixels",
        check_alt="image_pixels_raw",
        options=options,
        roots=[PICS],
        allow=[out],
        oracle=oracle,
        near_misses=near,
        decoy=decoy,
    )


def _paths(rng: random.Random, suffix: str, ext: str = "png") -> tuple[str, str]:
    src = f"{PICS}/{content.filename(rng, STEMS, 'png')}"
    return src, f"{src[:-4]}_{suffix}.{ext}"


def _transform_family(name: str, op: str, wrong: list[str], text: str, suffix: str) -> None:
    @family(name, "gimp")
    def generate(rng: random.Random) -> TaskSpec:
        img = make_image(rng)
        src, out = _paths(rng, suffix)
        expected = OPS[op][1](img)
        instr = f"Open {src} in GIMP, {text}, and export the result as PNG to {out}."
        oracle = gimp_solution("oracle", src, out, [OPS[op]])
        near = [gimp_solution(w, src, out, [OPS[w]], why=f"{w} instead of {op}") for w in wrong]
        near.append(
            gimp_solution(
                "overwrote_source",
                src,
                src,
                [OPS[op]],
                why="transforms the original in place, no export",
            )
        )
        return gimp_spec(
            rng, instr, src, img, out, expected, BLOCK, oracle, near, gray=(op == "gray")
        )


_transform_family(
    "gimp_flip_horizontal",
    "flip_h",
    ["flip_v", "rot_180", "copy"],
    "flip the image horizontally (mirror left-right)",
    "mirrored",
)
_transform_family(
    "gimp_flip_vertical",
    "flip_v",
    ["flip_h", "rot_180", "copy"],
    "flip the image vertically (upside down mirror)",
    "flipped",
)
_transform_family(
    "gimp_rotate_clockwise",
    "rot_cw",
    ["rot_ccw", "rot_180", "copy"],
    "rotate it 90 degrees clockwise",
    "rotated",
)
_transform_family("gimp_grayscale", "gray", ["invert", "copy"], "convert it to grayscale", "gray")
_transform_family(
    "gimp_invert_colors", "invert", ["gray", "flip_h", "copy"], "invert its colours", "inverted"
)


@family("gimp_scale_half", "gimp")
def scale_half(rng: random.Random) -> TaskSpec:
    img = make_image(rng)
    src, out = _paths(rng, "small")
    w, h = img.width // 2, img.height // 2
    right = scale_op(w, h)
    expected = right[1](img)
    instr = (
        f"Open {src} in GIMP, scale the image to half its size ({w}x{h} pixels), and export "
        f"it as PNG to {out}."
    )
    near = [
        gimp_solution("width_only", src, out, [scale_op(w, img.height)], why="keeps the height"),
        gimp_solution("quarter", src, out, [scale_op(w // 2, h // 2)], why="scaled too far"),
        gimp_solution(
            "canvas_crop", src, out, [crop_op(w, h, 0, 0)], why="cuts the canvas instead of scaling"
        ),
        gimp_solution("overwrote_source", src, src, [right], why="scales the original in place"),
    ]
    return gimp_spec(
        rng,
        instr,
        src,
        img,
        out,
        expected,
        BLOCK // 2,
        gimp_solution("oracle", src, out, [right]),
        near,
    )


@family("gimp_crop_left_half", "gimp")
def crop_left_half(rng: random.Random) -> TaskSpec:
    img = make_image(rng)
    src, out = _paths(rng, "left")
    w = (img.width // BLOCK // 2) * BLOCK
    right = crop_op(w, img.height, 0, 0)
    expected = right[1](img)
    instr = (
        f"Open {src} in GIMP, crop it to its left {w} pixels (full height), and export the "
        f"result as PNG to {out}."
    )
    near = [
        gimp_solution(
            "right_part",
            src,
            out,
            [crop_op(w, img.height, img.width - w, 0)],
            why="keeps the right part",
        ),
        gimp_solution(
            "top_part",
            src,
            out,
            [crop_op(img.width, img.height // 2, 0, 0)],
            why="crops to the top half",
        ),
        gimp_solution(
            "one_block_short",
            src,
            out,
            [crop_op(w - BLOCK, img.height, 0, 0)],
            why=f"{w - BLOCK} pixels wide",
        ),
        gimp_solution("copy", src, out, [OPS["copy"]], why="exports without cropping"),
    ]
    return gimp_spec(
        rng, instr, src, img, out, expected, BLOCK, gimp_solution("oracle", src, out, [right]), near
    )


@family("gimp_export_jpeg", "gimp")
def export_jpeg(rng: random.Random) -> TaskSpec:
    img = make_image(rng)
    src, out = _paths(rng, "export", "jpg")
    instr = f"Open {src} in GIMP and export it as a JPEG image to {out}, same size."
    png_named_jpg = Solution(
        "png_named_jpg",
        [execute(["cp", src, out])],
        lambda i: {out: i[src]},
        "copies the PNG bytes under a .jpg name",
    )
    near = [
        png_named_jpg,
        gimp_solution(
            "half_size",
            src,
            out,
            [scale_op(img.width // 2, img.height // 2)],
            "JPEG",
            why="scaled while exporting",
        ),
        gimp_solution(
            "wrong_folder",
            src,
            f"/home/user/Desktop/{out.rsplit('/', 1)[1]}",
            [OPS["copy"]],
            "JPEG",
            why="exported to the Desktop",
        ),
        gimp_solution("rotated", src, out, [OPS["rot_cw"]], "JPEG", why="rotated on export"),
    ]
    return gimp_spec(
        rng,
        instr,
        src,
        img,
        out,
        img,
        BLOCK,
        gimp_solution("oracle", src, out, [OPS["copy"]], "JPEG"),
        near,
        fmt="JPEG",
    )
