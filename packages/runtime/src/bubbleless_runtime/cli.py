"""``bubbleless train [CONFIG.yaml]``: train a model over a pipeline of local processes (or torchrun's).

Without a config it runs the embedded default (``default_config.py``): a small Qwen3-architecture model
learning to sort symbol strings, 4 CPU ranks, the zbv schedule, one to two minutes. Rank 0 shows a
progress bar and ends with the loss drop, tokens/s, the bubble rate measured from the run's own trace
beside the simulator's prediction, and the paths of a timeline PNG and a Chrome trace of the real run.

``pipeline.schedule: roundrobin`` (``--example roundrobin``: ``roundrobin_config.py``) trains in this
process instead, on a ``RoundRobinPipeline`` over ``pipeline.devices`` (one thread per device, the
training state in host memory), through the same Trainer, checkpoints and report.

This module is the command line (parser, config, exit codes) and the launcher; the training loop is
``train_loop.py`` (``run_rank``, ``run_pool``, re-exported here) over what ``train_pipelines.py`` builds.
``main`` and ``launch`` call ``run_rank`` and ``run_pool`` through this module's names, so a test that
patches ``cli.run_rank`` stops what ``main`` would start.

Exit codes: 0 done; 2 the user's input is wrong, one line ``bubbleless: <message>`` on stderr; 1 anything
else, with its traceback (a rank that died or stalled: one line naming it); 128 + N stopped by signal N.
A ``ValueError`` means the input is wrong and its message says what to change (the project's convention),
wherever it is raised: checking the config before any process starts, setting up or training in this process
(``run_pool``, ``run_rank``), or in a spawned rank (``launch.spawn`` raises the root cause again with its type,
so the message is printed once for the run, not once per rank).
"""

from __future__ import annotations

import argparse
import os
import sys

from .config import RunConfig, config_to_dict, load_config
from .config_checks import check_schedule, uses_pool, validate
from .config_runtime import check_before_run
from .default_config import DEFAULT_CONFIG_YAML
from .fetch_model import add_fetch_parser, run_fetch
from .generate import add_generate_parser, run_generate
from .launch import under_torchrun
from .roundrobin_config import ROUNDROBIN_CONFIG_YAML
from .signals import RunInterrupted
from .smollm2_config import smollm2_lora_yaml
from .train_loop import run_pool, run_rank
from .train_pipelines import check_reliability, first_step_timeout, reuse_checkpoint_cut

__all__ = ["EXAMPLES", "OVERRIDES", "build_parser", "launch", "main", "resolve_config", "run_pool", "run_rank"]

# --example NAME -> the embedded config it runs
EXAMPLES: dict[str, str] = {
    "default": DEFAULT_CONFIG_YAML, "roundrobin": ROUNDROBIN_CONFIG_YAML, "smollm2-lora": smollm2_lora_yaml(),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bubbleless", description="Pipeline-parallel training.")
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="train a model over a pipeline (default: the embedded demo)")
    train.add_argument(
        "config", nargs="?",
        help="YAML config; omitted: the embedded default. --print-config shows every field with its value; "
             "python -m bubbleless_runtime.config_docs prints the reference page of what each one means",
    )
    train.add_argument(
        "--example", choices=list(EXAMPLES),
        help="run an embedded example config instead of a file: default (4 CPU ranks, zbv; the same as no "
             "config), roundrobin (a pool of 4 CPU devices in one process) or smollm2-lora (LoRA fine-tuning of "
             "SmolLM2-135M on shipped instruction chats; first run bubbleless fetch-example-model smollm2-135m)",
    )
    train.add_argument("--nproc", type=int, help="local ranks to spawn (overrides pipeline.nproc)")
    train.add_argument("--steps", type=int, help="optimizer steps (overrides train.steps)")
    train.add_argument("--schedule", help="schedule name (overrides pipeline.schedule)")
    train.add_argument(
        "--output-dir", help="where the PNG, trace and checkpoints go (overrides train.output_dir)"
    )
    train.add_argument("--resume", help="checkpoint directory to resume from (overrides train.resume)")
    train.add_argument(
        "--print-config", action="store_true", help="print the resolved config as YAML and exit"
    )
    add_generate_parser(commands)
    add_fetch_parser(commands)
    return parser


# command-line flag -> (config section, field)
OVERRIDES: dict[str, tuple[str, str]] = {
    "nproc": ("pipeline", "nproc"),
    "steps": ("train", "steps"),
    "schedule": ("pipeline", "schedule"),
    "output_dir": ("train", "output_dir"),
    "resume": ("train", "resume"),
}


def resolve_config(args: argparse.Namespace) -> RunConfig:
    """The config file (or an embedded example, the default one without either) with the command-line
    overrides applied."""
    if args.config and args.example:
        raise ValueError(f"give a config file or --example {args.example}, not both")
    config = load_config(args.config) if args.config else load_config(text=EXAMPLES[args.example or "default"])
    for flag, (section, name) in OVERRIDES.items():
        value = getattr(args, flag)
        if value is not None:
            setattr(getattr(config, section), name, value)
    return validate(config)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "generate":
        return run_generate(args)
    if args.command == "fetch-example-model":
        return run_fetch(args)
    try:
        config = resolve_config(args)
        pool = uses_pool(config.pipeline.schedule)  # under torchrun: one pool per process, data-parallel
        if not args.print_config:  # before any process starts: the schedule, its shape and the partition
            num_ranks = int(os.environ["WORLD_SIZE"]) if under_torchrun() else config.pipeline.nproc
            check_reliability(config)
            reuse_checkpoint_cut(config)
            check_schedule(config, num_ranks=num_ranks)
            check_before_run(config, num_ranks=num_ranks)  # output_dir, GPU, LoRA targets, memory_cap
    except ValueError as error:
        print(f"bubbleless: {error}", file=sys.stderr)
        return 2
    if args.print_config:
        import yaml

        print(yaml.safe_dump(config_to_dict(config), sort_keys=False), end="")
        return 0
    from .launch import RankFailure

    try:
        if pool:
            run_pool(config)
        elif under_torchrun():  # this process is one rank
            run_rank(config)
            _end_rank_process()
        else:
            launch(config)
    except RunInterrupted as stopped:  # SIGTERM or Ctrl-C: the message says what was saved
        print(f"bubbleless: {stopped}", file=sys.stderr)
        if under_torchrun():
            _end_rank_process(stopped.exit_code)
        return stopped.exit_code
    except RankFailure as failure:  # a rank died or stalled: its traceback, if any, is in its own output
        print(f"bubbleless: {failure}", file=sys.stderr)
        return 1
    except ValueError as error:  # the user's input, found while setting up or training (note below)
        print(f"bubbleless: {error}", file=sys.stderr)
        if under_torchrun():
            _end_rank_process(2)
        return 2
    return 0


def _end_rank_process(code: int = 0) -> None:
    """End a torchrun rank after a finished run without Python's interpreter finalization.

    ProcessGroupGloo's worker threads drop a finished collective (and the Python tensors it holds) a
    moment after ``wait`` has returned in the main thread. When that moment falls inside finalization,
    the worker dies taking the GIL and the process aborts: a core dump of such a rank shows
    ``AsyncAllgatherWork::~AsyncAllgatherWork`` -> ``take_gil`` -> ``pthread_exit`` -> ``std::terminate``.
    torchrun then reports a failed run after a successful one (about one run in 20 on a loaded 2-core
    machine). Everything is written by now; flush and leave with ``code``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch(config: RunConfig) -> None:
    """Start ``pipeline.nproc`` local processes, each one pipeline rank (one process: no spawning)."""
    nproc = config.pipeline.nproc
    if nproc == 1:
        run_rank(config)
        return
    from .launch import spawn

    # the group's own timeout bounds blocking collectives (the Trainer's all-reduces) like the pipeline's
    # transfers: first_step_timeout while ranks start and run their first step, then pipeline.timeout
    # (train_pipelines.steady_timeouts), so a stalled rank ends the run within it wherever the others wait for it
    spawn(_spawned_rank, nproc, config, backend=config.pipeline.backend, pg_timeout=first_step_timeout(config))


def _spawned_rank(rank: int, config: RunConfig) -> None:
    """One child of ``launch.spawn`` (which has joined the process group already)."""
    run_rank(config)


if __name__ == "__main__":  # torchrun --nproc-per-node N -m bubbleless_runtime.cli train CONFIG.yaml
    sys.exit(main())
