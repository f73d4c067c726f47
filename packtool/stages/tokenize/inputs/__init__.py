"""The input room: how bytes on disk become records.

`locators/` turn an input argument into files (plain files, directories, globs, `save_to_disk`
directories, `hf://datasets/...`: `locators.expand_inputs`); `readers/` turn one kind of file into
records behind one contract (`readers/base.py`) and one registry (`readers/registry.py`); `plan.py`
cuts the files into chunks and reads a chunk with its reader. What a record means (text, chat, ...)
is the record shapes' business, not this room's.
"""
