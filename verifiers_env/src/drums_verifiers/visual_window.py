"""The visual-context window: only the last K screenshots stay images in the model's context.

A desktop episode adds a screenshot per action; keeping all of them costs the context and the
attention of the model for pixels that no longer exist. Older images become a short text
placeholder, so the transcript still says a screenshot was there. Pure, stdlib only: this
module is also bundled verbatim into the harness's chat program.
"""

from typing import Any

PLACEHOLDER = "[earlier screenshot omitted: only the latest {k} stay visible]"


def apply_visual_window(messages: list[dict[str, Any]], k: int) -> list[dict[str, Any]]:
    """A copy of `messages` (OpenAI chat format) keeping only the last `k` image parts."""
    seen = 0
    out: list[dict[str, Any]] = []
    for message in reversed(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.append(message)
            continue
        parts = []
        for part in reversed(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                seen += 1
                if seen > k:
                    part = {"type": "text", "text": PLACEHOLDER.format(k=k)}
            parts.append(part)
        parts.reverse()
        out.append({**message, "content": parts})
    out.reverse()
    return out


def count_images(messages: list[dict[str, Any]]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if isinstance(p, dict) and p.get("type") == "image_url"
    )
