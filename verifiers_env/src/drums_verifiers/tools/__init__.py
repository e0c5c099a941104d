"""The model's tool servers, one module per tool style (each runs as `python -m <module>`)."""

from __future__ import annotations

import verifiers.v1 as vf


def toolset_for(style: str) -> type[vf.Toolset]:
    """The Toolset class of a tool style; imported lazily so each server loads only its own."""
    if style == "drums":
        from drums_verifiers.tools.drums_style import DrumsTools

        return DrumsTools
    if style == "scalecua":
        from drums_verifiers.tools.scalecua_style import ScaleCUATools

        return ScaleCUATools
    if style == "hybrid":
        from drums_verifiers.tools.hybrid_style import HybridTools

        return HybridTools
    if style == "anthropic":
        from drums_verifiers.tools.anthropic_style import AnthropicTools

        return AnthropicTools
    if style == "openai":
        from drums_verifiers.tools.openai_style import OpenAITools

        return OpenAITools
    raise ValueError(
        f"unknown tool style {style!r}; use drums, scalecua, hybrid, anthropic or openai"
    )
