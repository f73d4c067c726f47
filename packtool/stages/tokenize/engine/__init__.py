"""The tokenizer engine room: find a tokenizer (`locate.py`, light: no numpy, no `tokenizers`), load it and
its special tokens (`tokenizer.py`), its chat template (`template.py`), and start loading the fast engine
before the run's own imports (`early.py`). It imports nothing of the run around it (tests/test_architecture.py).
"""
