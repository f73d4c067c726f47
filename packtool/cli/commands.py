"""The `packtool` commands: parse flags, build a validated config, call ONE library function, print.

Every `PacktoolError` becomes one line `error: ...` on stderr and exit code 1 (see `main`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from packtool import __version__
from packtool.choices import (
    Algorithm,
    AssistantTurns,
    BackendName,
    ExecutorName,
    ExportTarget,
    InputFormat,
    OnError,
    Overlong,
    Split,
)
from packtool.cli import summaries
from packtool.cli.help import PlainCommand, PlainGroup
from packtool.cli.progress import progress_bar
from packtool.cli.stats_text import stats_text

app = typer.Typer(
    name="packtool",
    help="Tokenize raw LLM training data and bin-pack it into memory-mapped packs without padding waste.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=PlainGroup,
)

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")]
Workers = Annotated[int | None, typer.Option("--workers", min=1, help="Parallel workers (default: all cores).")]
Executor = Annotated[ExecutorName, typer.Option("--executor", help="Where the tasks run.")]
RayAddress = Annotated[str | None, typer.Option("--ray-address", help="Ray cluster to join (default: a local one).")]
Seed = Annotated[int, typer.Option("--seed", help="Seed: same input and seed give identical bytes.")]
StatsSeed = Annotated[
    int,
    typer.Option(
        "--seed",
        help="Seed of the random batches, the dynamic batcher's shuffle and the shuffling packers: the same store "
        "and seed give the same numbers.",
    ),
]
StorePath = Annotated[Path, typer.Argument(help="A token store or a pack store (ROOT, ROOT/packed/TOKENIZER or .npy).")]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"packtool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """packtool: raw data -> token store -> pack store -> GPU batches."""


def _input_help() -> str:
    """The INPUT help; the readable suffixes come from the input readers' registry (read when typer builds
    `tokenize`'s parameters). Help is plain text (`cli/help.py`): brackets show as written."""
    from packtool.stages.tokenize.inputs.readers.registry import suffix_text

    return f"Files, directories or globs: {suffix_text()}, save_to_disk dirs; hf://datasets/ORG/NAME[@REVISION][/PATH]."


@app.command(cls=PlainCommand)
def tokenize(
    inputs: Annotated[
        list[str],
        typer.Argument(help=_input_help()),
    ],
    tokenizer: Annotated[str, typer.Option("--tokenizer", help="tokenizer.json, a model directory, or a hub name.")],
    output: Annotated[Path, typer.Option("--output", help="Token store directory to create.")],
    format: Annotated[
        InputFormat, typer.Option("--format", help="How records become tokens and loss.")
    ] = InputFormat.TEXT,
    field: Annotated[
        str | None, typer.Option("--field", help="Text field (dotted path) for --format text (default: text).")
    ] = None,
    prompt_field: Annotated[
        str | None, typer.Option("--prompt-field", help="prompt-completion, preference: prompt.")
    ] = None,
    completion_field: Annotated[
        str | None, typer.Option("--completion-field", help="prompt-completion: completion.")
    ] = None,
    messages_field: Annotated[
        str | None,
        typer.Option("--messages-field", help="chat, openai: messages; sharegpt, preference: conversations."),
    ] = None,
    role_map: Annotated[
        str | None,
        typer.Option("--role-map", help="chat/sharegpt/preference: FROM=TO,... onto system/user/assistant/tool."),
    ] = None,
    instruction_field: Annotated[
        str | None, typer.Option("--instruction-field", help="alpaca, preference: instruction.")
    ] = None,
    input_field: Annotated[str | None, typer.Option("--input-field", help="alpaca, preference: input.")] = None,
    output_field: Annotated[str | None, typer.Option("--output-field", help="alpaca: output.")] = None,
    history_field: Annotated[str | None, typer.Option("--history-field", help="alpaca, preference: history.")] = None,
    system_field: Annotated[
        str | None, typer.Option("--system-field", help="alpaca/sharegpt/preference: system.")
    ] = None,
    chat_template: Annotated[str | None, typer.Option("--chat-template", help="Jinja chat template file.")] = None,
    assistant_turns: Annotated[
        AssistantTurns, typer.Option("--assistant-turns", help="chat: train on all or only the last assistant turn.")
    ] = AssistantTurns.ALL,
    separator: Annotated[
        str | None, typer.Option("--separator", help="Split .txt files into documents at STR.")
    ] = None,
    media_dir: Annotated[
        str | None,
        typer.Option("--media-dir", help="Images: relative paths resolve here (absolute ones may lie here)."),
    ] = None,
    bos: Annotated[bool | None, typer.Option("--bos/--no-bos", help="Default: as the tokenizer does.")] = None,
    eos: Annotated[bool | None, typer.Option("--eos/--no-eos", help="Default: EOS when defined (not chat).")] = None,
    workers: Workers = None,
    on_error: Annotated[
        OnError, typer.Option("--on-error", help="fail at file:line, or skip to rejects.jsonl.")
    ] = OnError.FAIL,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a different existing token store.")] = False,
    max_record_bytes: Annotated[
        int, typer.Option("--max-record-bytes", min=1, help="Longest record in bytes; longer is a bad record.")
    ] = 16 << 20,  # TokenizeConfig's default (a test checks they agree)
    chunk_bytes: Annotated[
        int | None, typer.Option("--chunk-bytes", min=1, hidden=True, help="Unit of work/resume (default: auto).")
    ] = None,
    backend: Annotated[
        BackendName, typer.Option("--backend", help="auto: fast when installed and verified.")
    ] = BackendName.AUTO,
    num_shards: Annotated[int, typer.Option("--num-shards", min=1, help="Split into N shards (join with merge).")] = 1,
    shard_index: Annotated[int, typer.Option("--shard-index", min=0, help="Which shard this run writes.")] = 0,
    executor: Executor = ExecutorName.LOCAL,
    ray_address: RayAddress = None,
    subset: Annotated[
        str | None, typer.Option("--subset", help="hf://datasets inputs: the config, as load_dataset names it.")
    ] = None,
    split: Annotated[
        str | None, typer.Option("--split", help="hf://datasets inputs: the split (default: train).")
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Tokenize raw data into a token store (tokens.bin + tokens.boundaries [+ tokens.loss] + manifest.json)."""
    from packtool.stages.tokenize import TokenizeConfig, tokenize_corpus

    args = {k: v for k, v in locals().items() if k not in ("quiet", "TokenizeConfig", "tokenize_corpus")}
    config = TokenizeConfig(**{**args, "inputs": tuple(inputs), "output": str(output)}).validate()
    with progress_bar(quiet, "tokenize", "B") as progress:
        typer.echo(summaries.tokenize_line(tokenize_corpus(config, progress)))


@app.command(cls=PlainCommand)
def pack(
    tokens_dir: Annotated[
        list[str],
        typer.Argument(
            metavar="STORE[:WEIGHT]",
            help="Token store(s) made by `packtool tokenize`, each STORE[:WEIGHT] (epochs; a mixture of one tokenizer).",
        ),
    ],
    size: Annotated[int, typer.Option("--size", help="Pack size N in tokens.")],
    output: Annotated[Path, typer.Option("--output", help="Pack ROOT; files go to ROOT/packed/TOKENIZER/.")],
    algorithm: Annotated[Algorithm, typer.Option("--algorithm", help="Bin-packing algorithm.")] = Algorithm.BFD,
    seed: Seed = 0,
    shuffle: Annotated[bool, typer.Option("--shuffle/--no-shuffle", help="Seeded random pack order.")] = True,
    overlong: Annotated[Overlong, typer.Option("--overlong", help="Documents longer than N.")] = Overlong.SPLIT,
    pad_multiple: Annotated[int, typer.Option("--pad-multiple", help="Pad every segment to a multiple of M.")] = 1,
    max_docs_per_pack: Annotated[int | None, typer.Option("--max-docs-per-pack", help="At most K per pack.")] = None,
    vision_budget: Annotated[
        int | None, typer.Option("--vision-budget", help="Image stores: at most PATCHES vision patches per pack.")
    ] = None,
    split: Annotated[Split, typer.Option("--split", help="Which split this is.")] = Split.TRAINING,
    workers: Workers = None,
    executor: Executor = ExecutorName.LOCAL,
    ray_address: RayAddress = None,
    validation: Annotated[
        float | None, typer.Option("--validation", help="Hold out this fraction of documents as validation_N.")
    ] = None,
    share_prompt: Annotated[
        bool, typer.Option("--share-prompt", help="Preference store: hold each pair's prompt once [P][C][R].")
    ] = False,
    quiet: Quiet = False,
) -> None:
    """Bin-pack token store(s) into fixed-size packs (SPLIT_N.npy + CSR companions + metadata)."""
    from packtool.stages.pack import PackConfig, mixture_args, pack_store

    args = {k: v for k, v in locals().items() if k not in ("quiet", "PackConfig", "pack_store", "mixture_args")}
    args["tokens_dir"], args["weights"] = mixture_args(tokens_dir)  # a weight <= 0: UsageError, exit 2
    config = PackConfig(**args).validate()
    with progress_bar(quiet, "pack", "pack") as progress:
        typer.echo(summaries.pack_line(pack_store(config, progress)))


@app.command(cls=PlainCommand)
def stats(
    path: Annotated[
        list[Path],
        typer.Argument(
            help="A token store or a pack store (ROOT, ROOT/packed/TOKENIZER or .npy); or pack stores STORE:W ... "
            "blended at load time (each store's share of samples and tokens, its epochs).",
        ),
    ],
    size: Annotated[
        int | None, typer.Option("--size", help="Pack size N (token store: default 4096, named so).")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Batch size B for the padded baselines.")] = 8,
    seed: StatsSeed = 0,
    split: Annotated[Split, typer.Option("--split", help="Split of a pack store.")] = Split.TRAINING,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a PNG: lengths, waste vs the lower bound.")] = None,
    world_size: Annotated[
        int | None, typer.Option("--world-size", help="Pack store: step efficiency over W data-parallel ranks.")
    ] = None,
    micro_batches: Annotated[int, typer.Option("--micro-batches", help="Packs per rank per step B.")] = 1,
    model: Annotated[Path | None, typer.Option("--model", help="config.json pricing packs (cost model).")] = None,
    hidden_size: Annotated[int | None, typer.Option("--hidden-size", help="Or a hidden size h for the cost.")] = None,
) -> None:
    """Length percentiles and padding waste of every batching strategy (token store), or pack fill (pack store)."""
    from packtool.errors import UsageError
    from packtool.stages.stats import StatsConfig, check_plot_path, compute_stats, plot_stats
    from packtool.stages.stats.blend import BlendStats, blend_sources

    blend = blend_sources(path)
    if blend is not None and plot is not None:
        raise UsageError("--plot draws one store, not a blend, drop --plot or pass one store")
    config = StatsConfig(
        path[0], size, batch_size, seed, split, world_size, micro_batches, model, hidden_size, blend
    ).validate()
    if plot is not None:
        check_plot_path(plot)  # before any work or output
    result = compute_stats(config)
    typer.echo(stats_text(result, as_json))
    if plot is not None and not isinstance(result, BlendStats):
        plot_stats(result, plot)
        typer.echo(f"plot -> {plot}", err=True)  # stderr: --json stays one object on stdout


@app.command(cls=PlainCommand)
def verify(
    path: StorePath,
    source: Annotated[
        list[Path] | None,
        typer.Option("--source", help="Token store the packs came from (repeat it for each store of a mixture)."),
    ] = None,
    quiet: Quiet = False,
) -> None:
    """Check every invariant and checksum of a store; with --source, every document packed once, unchanged."""
    from packtool.stages.verify import VerifyConfig, verify_path

    sources = tuple(source) if source and len(source) > 1 else (source[0] if source else None)
    with progress_bar(quiet, "verify", "tok") as progress:
        typer.echo(summaries.verify_line(verify_path(VerifyConfig(path, sources), progress)))


@app.command(cls=PlainCommand)
def merge(
    shards: Annotated[list[Path], typer.Argument(help="Shard token stores of one `tokenize --num-shards` run.")],
    output: Annotated[Path, typer.Option("--output", help="Merged token store (identical to a single run).")],
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing token store.")] = False,
    quiet: Quiet = False,
) -> None:
    """Join shard token stores into the one store a single (unsharded) run writes."""
    from packtool.stages.merge import merge_shards

    with progress_bar(quiet, "merge", "tok") as progress:
        typer.echo(summaries.merge_line(merge_shards(shards, output, overwrite=overwrite, progress=progress)))


@app.command(cls=PlainCommand)
def export(
    path: Annotated[Path, typer.Argument(help="A pack store: ROOT, ROOT/packed/TOKENIZER or SPLIT_N.npy.")],
    to: Annotated[ExportTarget, typer.Option("--to", help="The trainer whose format to write.")],
    output: Annotated[Path, typer.Option("--output", help="Directory for the trainer's files.")],
    split: Annotated[Split, typer.Option("--split", help="Split to export.")] = Split.TRAINING,
    size: Annotated[int | None, typer.Option("--size", help="Pack size N (default: the only one).")] = None,
    eos_id: Annotated[int | None, typer.Option("--eos-id", help="EOS id (default: the token store's).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace this export's files.")] = False,
    quiet: Quiet = False,
) -> None:
    """Write a pack store in a trainer's own format (row i = pack i); print the config lines that read it."""
    from packtool.stages.export import ExportConfig, export_store

    config = ExportConfig(path, to, output, str(split), size, eos_id, overwrite).validate()
    with progress_bar(quiet, "export", "pack") as progress:
        for line in summaries.export_lines(export_store(config, progress)):
            typer.echo(line)


@app.command(cls=PlainCommand)
def run(
    config: Annotated[Path, typer.Argument(help="YAML: sections tokenize/pack/stats/verify/export or a `steps` list.")],
    quiet: Quiet = False,
) -> None:
    """Run tokenize -> pack -> stats (+ plot) -> verify -> export from one config file (examples in configs/).

    Each section is one command and each key one of its flags (`pad_multiple: 8` is `--pad-multiple 8`); inside
    a step, pack reads what tokenize wrote, and stats, verify and export read the pack store just written (an
    `export` section with `to: trl` and `output: out/trl` writes TRL's files). Relative paths resolve against
    the YAML file's directory; the whole file is checked before any work starts.
    """
    from packtool.cli.runconfig import load_run_config
    from packtool.stages.run import run_pipeline

    steps = load_run_config(config)  # every section checked before the first step runs
    with progress_bar(quiet, "run", "it") as update:
        progress = None if update is None else (lambda stage, done, total: update(done, total))
        for line in summaries.run_lines(run_pipeline(steps, progress)):
            typer.echo(line)


@app.command(cls=PlainCommand)
def audit(
    model: Annotated[str, typer.Argument(help="A transformers model directory, a config.json, or a cached hub name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    trust_remote_code: Annotated[
        bool, typer.Option("--trust-remote-code", help="Allow the model's own code (from disk only).")
    ] = False,
    attn_implementation: Annotated[
        list[str] | None,
        typer.Option("--attn-implementation", help="Try only these (repeatable; default: every one present)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random weights and documents.")] = 0,
) -> None:
    """Packed vs separate documents through MODEL's architecture (tiny, random weights, CPU): exact or leaking?

    Exit 0 when a recommended packed setup is exact, 1 when none is. Needs the audit extra (torch, transformers).
    """
    from packtool.audit.source import require_transformers

    require_transformers()  # one line naming the extra, before torch is imported
    from packtool.audit.audit import AuditConfig, audit_model

    config = AuditConfig(model, trust_remote_code, tuple(attn_implementation or ()), seed).validate()
    report = audit_model(config)
    typer.echo(summaries.audit_text(report, as_json))
    if not report.exact:  # exit 1 says no packed setup is exact: one error line, as every exit 1 has
        typer.echo(summaries.error_line(summaries.audit_failure(report)), err=True)
        raise typer.Exit(1)
