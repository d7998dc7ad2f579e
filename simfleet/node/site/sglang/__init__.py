"""SGLang stand-in for simulated nodes (simfleet). Not SGLang: it behaves like the configured
SGLang version as far as a control panel can see, and does no inference."""

from __future__ import annotations


def _version() -> str:
    try:
        from simnode import state

        return str(state.config()["sglang_version"])
    except (OSError, KeyError, ValueError):
        return "0.5.9"


__version__ = _version()
