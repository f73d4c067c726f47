"""The pure core: arrays and strings in, arrays out. No file I/O of packtool's, no executors, no stages.

`packing`: bin-packing algorithms over item lengths, and how documents become segments.
`encoding`: text and chat encoding through a tokenizer engine, with loss masks.
"""
