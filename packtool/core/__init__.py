"""The pure core: arrays and strings in, arrays out. No file I/O of packtool's, no executors, no stages.

`packing`: bin-packing algorithms over item lengths, and how documents become segments.
`encoding`: text and chat encoding through a tokenizer engine, with loss masks.
`batching`: dynamic batching plans under a token budget (the loader's sampler and `stats` share it).
`cost`: `CostModel`, the FLOP price of a segment, document or pack (linear plus causal attention).
`balance`: the plain epoch order of packs and its window-balanced rearrangement over data-parallel ranks.
"""
