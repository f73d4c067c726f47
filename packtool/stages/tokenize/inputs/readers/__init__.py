"""Input readers: one module per source kind behind `base.Reader`, listed once in `registry.py`."""
