"""Attention kernels as an ordered table of specs: one module per kernel, `registry.KERNELS` orders them.

`spec.py` is the contract (import, capability, extra checks, adapter; the `Call` every adapter
gets), `flash_api.py` what flash-attn's generations share, `registry.py` the table `auto` walks.
"""
