"""The `packtool` command line: parse flags, build a config, call ONE library function, print.

Every `PacktoolError` becomes one line `error: ...` on stderr and exit code 1.
Progress bars (tqdm) live here only; the library reports progress through callbacks.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from packtool import __version__
from packtool.config import Algorithm, InputFormat, OnError, Overlong, PackConfig, Split, StatsConfig
from packtool.errors import PacktoolError

app = typer.Typer(
    name="packtool",
    help="Tokenize raw LLM training data and bin-pack it into memory-mapped packs without padding waste.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"packtool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """packtool: raw data -> token store -> pack store -> GPU batches."""


# ---- commands are added below, one short function each ----


@contextlib.contextmanager
def _done_total_bar(quiet: bool, desc: str, unit: str) -> Iterator[Callable[[int, int], None] | None]:
    """A `progress(done, total)` callback drawing a tqdm bar on a terminal (None with --quiet or when piped)."""
    if quiet or not sys.stderr.isatty():
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(desc=desc, unit=unit, leave=False, file=sys.stderr)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    try:
        yield update
    finally:
        bar.close()


@app.command()
def tokenize(
    inputs: Annotated[
        list[str], typer.Argument(help="Files, directories or globs: .jsonl, .jsonl.gz, .jsonl.zst, .parquet, .txt.")
    ],
    tokenizer: Annotated[
        str, typer.Option("--tokenizer", help="tokenizer.json, a model directory, or a cached hub name.")
    ],
    output: Annotated[Path, typer.Option("--output", help="Token store directory to create.")],
    format: Annotated[
        InputFormat, typer.Option("--format", help="How records become tokens and loss.")
    ] = InputFormat.TEXT,
    field: Annotated[str, typer.Option("--field", help="Text field (dotted path) for --format text.")] = "text",
    prompt_field: Annotated[str, typer.Option("--prompt-field")] = "prompt",
    completion_field: Annotated[str, typer.Option("--completion-field")] = "completion",
    messages_field: Annotated[str, typer.Option("--messages-field")] = "messages",
    chat_template: Annotated[str | None, typer.Option("--chat-template", help="Jinja chat template file.")] = None,
    separator: Annotated[
        str | None, typer.Option("--separator", help="Split .txt files into documents at STR.")
    ] = None,
    bos: Annotated[bool | None, typer.Option("--bos/--no-bos", help="Default: as the tokenizer does.")] = None,
    eos: Annotated[
        bool | None, typer.Option("--eos/--no-eos", help="Default: append EOS when defined (not for chat).")
    ] = None,
    workers: Annotated[int | None, typer.Option("--workers", min=1, help="Default: all cores.")] = None,
    on_error: Annotated[
        OnError, typer.Option("--on-error", help="fail: stop at file:line; skip: log to rejects.jsonl.")
    ] = OnError.FAIL,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a different existing store.")] = False,
    chunk_bytes: Annotated[int, typer.Option("--chunk-bytes", min=1, hidden=True, help="Unit of work/resume.")] = 16
    << 20,
    backend: Annotated[
        str,
        typer.Option(
            "--backend", help="auto|hf|fast: auto uses fast (fastokens) when installed and verified identical."
        ),
    ] = "auto",
    num_shards: Annotated[
        int, typer.Option("--num-shards", min=1, help="Split the chunks into N contiguous shards (join with `merge`).")
    ] = 1,
    shard_index: Annotated[
        int, typer.Option("--shard-index", min=0, help="Which shard this run writes (0-based).")
    ] = 0,
    executor: Annotated[str, typer.Option("--executor", help="local|ray: where chunks run.")] = "local",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster to join (default: start a local one).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Tokenize raw data into a token store (tokens.bin + tokens.boundaries [+ tokens.loss] + manifest.json)."""
    from packtool.tokenization import TokenizeConfig, tokenize_corpus

    config = TokenizeConfig(
        tuple(inputs),
        tokenizer,
        str(output),
        format,
        field,
        prompt_field,
        completion_field,
        messages_field,
        chat_template,
        separator,
        bos,
        eos,
        workers,
        on_error,
        overwrite,
        chunk_bytes,
        backend=backend,
        num_shards=num_shards,
        shard_index=shard_index,
        executor=executor,
        ray_address=ray_address,
    )
    with _done_total_bar(quiet, "tokenize", "B") as progress:
        result = tokenize_corpus(config, progress)
    m = result.manifest
    state = "up to date" if result.up_to_date else f"{result.reused_chunks}/{result.n_chunks} chunks reused"
    typer.echo(
        f"tokenized {m['n_documents']} documents, {m['n_tokens']} tokens ({m['n_target_tokens']} targets, {m['dtype']}), "
        f"{m.get('n_rejected', 0)} rejected, {state} -> {result.path}"
    )


@app.command()
def pack(
    tokens_dir: Annotated[Path, typer.Argument(help="Token store made by `packtool tokenize`.")],
    size: Annotated[int, typer.Option("--size", help="Pack size N in tokens.")],
    output: Annotated[Path, typer.Option("--output", help="Pack ROOT; files go to ROOT/packed/{tokenizer}/.")],
    algorithm: Annotated[Algorithm, typer.Option("--algorithm", help="Bin-packing algorithm.")] = Algorithm.BFD,
    seed: Annotated[int, typer.Option("--seed", help="Seed: same input and seed give identical bytes.")] = 0,
    shuffle: Annotated[bool, typer.Option("--shuffle/--no-shuffle", help="Seeded random pack order.")] = True,
    overlong: Annotated[Overlong, typer.Option("--overlong", help="Documents longer than N.")] = Overlong.SPLIT,
    pad_multiple: Annotated[int, typer.Option("--pad-multiple", help="Pad every segment to a multiple of M.")] = 1,
    max_docs_per_pack: Annotated[
        int | None, typer.Option("--max-docs-per-pack", help="At most K segments per pack.")
    ] = None,
    split: Annotated[Split, typer.Option("--split", help="Which split this is.")] = Split.TRAINING,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Parallel block writers (default: all cores).")
    ] = None,
    executor: Annotated[str, typer.Option("--executor", help="local|ray: where pack blocks are written.")] = "local",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="Ray cluster to join (default: start a local one).")
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Bin-pack a token store into fixed-size packs (`{split}_{N}.npy` + CSR companions + metadata)."""
    from packtool.packing.writer import pack_store

    config = PackConfig(
        tokens_dir,
        size,
        output,
        algorithm,
        seed,
        shuffle,
        overlong,
        pad_multiple,
        max_docs_per_pack,
        split,
        workers,
        executor,
        ray_address,
    )
    with _done_total_bar(quiet, "pack", "pack") as progress:
        result = pack_store(config, progress)
    m = result.metadata
    typer.echo(
        f"packed {m['n_segments']} segments ({m['n_tokens']} tokens) into {m['n_packs']} packs of {m['pack_size']} "
        f"(lower bound {m['lower_bound_packs']}), fill {m['packing_efficiency']}% "
        f"(real tokens {100 * m['n_tokens'] / max(1, m['n_packs'] * m['pack_size']):.2f}%), "
        f"{m['overlong']['count']} over-long ({m['overlong']['policy']}) -> {result.directory}"
    )


@app.command()
def stats(
    path: Annotated[Path, typer.Argument(help="A token store or a pack store (ROOT, packed/{tokenizer} or .npy).")],
    size: Annotated[int | None, typer.Option("--size", help="Pack size N (token store: default 4096).")] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size B for the padded-batch baselines.")] = 8,
    seed: Annotated[int, typer.Option("--seed", help="Seed for random batches and shuffling algorithms.")] = 0,
    split: Annotated[Split, typer.Option("--split", help="Split of a pack store.")] = Split.TRAINING,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    plot: Annotated[
        Path | None, typer.Option("--plot", help="Write a PNG (length histogram, waste per strategy).")
    ] = None,
) -> None:
    """Length percentiles and padding waste of every batching strategy (token store), or pack fill (pack store)."""
    import json

    from packtool.stats import compute_stats, plot_stats

    result = compute_stats(StatsConfig(path, size, batch_size, seed, split))
    typer.echo(json.dumps(result.to_dict(), sort_keys=True) if as_json else result.to_text())
    if plot is not None:
        plot_stats(result, plot)


@app.command()
def verify(
    path: Annotated[Path, typer.Argument(help="A token store or a pack store (ROOT, packed/{tokenizer} or .npy).")],
    source: Annotated[
        Path | None,
        typer.Option("--source", help="Token store the packs were made from: check every document round-trips."),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Check every invariant and checksum of a store; with --source, that every document is packed exactly once, unchanged."""
    from packtool.config import VerifyConfig
    from packtool.verify import verify_path

    with _done_total_bar(quiet, "verify", "tok") as progress:
        report = verify_path(VerifyConfig(path, source), progress)
    typer.echo(f"ok: {report.to_text()}")


@app.command()
def merge(
    shards: Annotated[
        list[Path], typer.Argument(help="Shard token stores of one `tokenize --num-shards N` run, any order.")
    ],
    output: Annotated[Path, typer.Option("--output", help="Merged token store (byte-identical to a single run).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing output.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Join shard token stores into the one store a single (unsharded) run writes."""
    from packtool.merge import merge_shards

    with _done_total_bar(quiet, "merge", "tok") as progress:
        result = merge_shards(shards, output, overwrite=overwrite, progress=progress)
    m = result.manifest
    typer.echo(
        f"merged {result.n_shards} shards: {m['n_documents']} documents, {m['n_tokens']} tokens -> {result.path}"
    )


@app.command()
def run(
    config: Annotated[
        Path, typer.Argument(help="YAML file: sections tokenize/pack/stats/verify (or a `steps` list); keys = flags.")
    ],
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Run tokenize -> pack -> stats (+ plot) -> verify from one config file (examples in configs/)."""
    from packtool.runconfig import describe, run_pipeline

    with _done_total_bar(quiet, "run", "it") as update:
        progress = None if update is None else (lambda stage, done, total: update(done, total))
        result = run_pipeline(config, progress)
    for line in describe(result):
        typer.echo(line)


def main() -> None:
    """Console entry point: typer handles usage errors (exit 2); PacktoolError becomes one line, exit 1."""
    try:
        app()
    except PacktoolError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(1)
