"""Record shapes: how one record becomes a text with target spans, or a conversation with per-turn targets.

One module per shape, each defining `SPEC` (a `base.ShapeSpec`: name, default fields, which flags
apply, detection for `--format auto`, the converter, what the manifest records), and one registry:
`packtool.choices.InputFormat`. Every `--format` value but `auto` names a shape, and the shape named
N lives in `N.py` (dashes as underscores); a shape that the same `--format` reads when the first
record says so (TRL's conversational prompt-completion under `prompt-completion`) is a *variant*,
named in its base spec and living in its own module the same way. `registry.py` finds the specs
(importing a shape's module only when a run needs it, so `packtool --help` imports none);
`detect.py` is `--format auto` over sampled records; `fields.py` and `roles.py` are what the
converters share (dotted field access, the top-level tools and system prompt, role maps).

Adding a shape (docs/ARCHITECTURE.md walks through `openai`): write `N.py` with its converter,
detection and `SPEC`, add the one line `N = "n"` to `InputFormat`, test it, document it.
Nothing else names a shape: the CLI choices, the flag checks, the auto error text and the
manifest's fields all come from the specs, and tests/test_shape_registry.py ties the two together.

This package imports nothing at import time (`registry` is imported by name where it is needed).
"""
