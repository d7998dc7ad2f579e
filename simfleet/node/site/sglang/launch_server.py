"""``python3 -m sglang.launch_server <flags>``: the stand-in's entry point."""

from __future__ import annotations

if __name__ == "__main__":
    from sglang._standin.server import main

    main()
