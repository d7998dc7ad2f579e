"""What runs *inside* a simulated node: its memory ledger, nvidia-smi, NVML, dmesg, helpers.

Stdlib only: it runs on the node's own ``python3`` (Debian's), found through the node's
``/usr/local/lib/python3.X/dist-packages``. Everything about the node lives under ``/run/simfleet``
inside the node's mount namespace.
"""
