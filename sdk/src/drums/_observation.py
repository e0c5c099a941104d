"""What an agent sees: the desktop's PNG, and the episode's metadata (instruction and more)."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Optional

if TYPE_CHECKING:  # Pillow is an optional extra (drums-sdk[image])
    from PIL.Image import Image


@dataclass(frozen=True)
class Observation:
    """`png` is the raw screenshot (PNG unless another format was asked for: see
    `content_type`); `image` decodes it with Pillow on first use.

    `meta` holds `env_id`, `episode`, `episode_id`, `task_id`, `instruction` and `actions`.
    """

    png: bytes
    meta: Dict[str, Any] = field(default_factory=dict)
    # image/png unless observe() asked for jpeg or webp (then `png` holds those bytes)
    content_type: str = "image/png"

    @property
    def instruction(self) -> str:
        return str(self.meta.get("instruction") or "")

    @property
    def image(self) -> Image:
        cached: Optional[Image] = self.__dict__.get("_image")
        if cached is None:
            try:
                from PIL import Image as PILImage
            except ImportError as exc:
                raise ImportError(
                    "Observation.image needs Pillow: pip install 'drums-sdk[image]' "
                    "(or use Observation.png, the raw bytes)"
                ) from exc
            cached = PILImage.open(io.BytesIO(self.png))
            cached.load()
            object.__setattr__(self, "_image", cached)  # frozen dataclass: cache by hand
        return cached

    def __repr__(self) -> str:
        return f"Observation(png=<{len(self.png)} bytes>, meta={self.meta!r})"
