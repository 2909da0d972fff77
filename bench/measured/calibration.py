"""The modelled-vs-measured table (issue 10, section 3, calibration): each measured system's tokens/s
against what its cost model predicts on the ``cpu`` hardware profile measured on this machine
(bench/modelled/cpu.yaml with its small-op rates, cpu_ops.yaml), at the scenario's shape, workers, sequence
and batch, in fp32; against the measured tokens/s as run and with each step's run-queue wait taken out
(``runner.merge``: ``tokens_per_s_less_wait``), the figure a profile timed by thread CPU time predicts."""

from __future__ import annotations

from bubbleless_partition import TransformerShape

from .scenario import Scenario


def tiny_shape(scenario: Scenario) -> TransformerShape:
    m = scenario.model
    return TransformerShape(name=f"{scenario.name} (measured scenario)", num_layers=m.layers, hidden=m.hidden,
                            intermediate=m.intermediate, heads=m.heads, kv_heads=m.heads, vocab=m.vocab)


def calibration_rows(scenario: Scenario, systems: dict, *, hardware=None):
    """``hardware``: the profile the model prices on (default the committed ``cpu`` profile)."""
    from bench.modelled import systems as modelled_systems
    from bench.modelled.calibrate import calibrate, cpu_point

    known = {n for n, s in modelled_systems().items() if s.modelled is not None}
    measured = {n: r["tokens_per_s"] for n, r in systems.items() if n in known and r.get("tokens_per_s")}
    load_free = {n: systems[n]["tokens_per_s_less_wait"] for n in measured if systems[n].get("tokens_per_s_less_wait")}
    point = cpu_point(tiny_shape(scenario), hardware=hardware, gpus=scenario.workers, seq_len=scenario.seq_len,
                      micro_batch=scenario.micro_batch, global_batch=scenario.global_batch, precision="fp32")
    return calibrate(measured, point=point, load_free=load_free), sorted(set(systems) - known)


PHYSICS = (
    "What the model prices on this profile (bench/modelled/common.py `small_op_profile`, rates in "
    "bench/modelled/cpu_ops.yaml, each timed at this scenario's sizes by thread CPU time over copies past the "
    "L2 cache): each matrix multiply pass (forward, input gradient, weight gradient) at its own measured rate; "
    "attention at its measured forward and backward rates (head width 64 runs it at about a third of the GEMM "
    "rate); the norms, SiLU, gating multiply and residual adds as the bytes they move at the measured "
    "elementwise rate; the loss over the vocabulary at its measured rate; accumulating each micro-batch's weight gradients into "
    "`.grad` (3 passes over the parameters at the elementwise rate, every micro-batch but the first, the "
    "embedding's included; the data-parallel frameworks over a rank's own micro-batches into its 1/g shard); on the "
    "stages a schedule splits (ZB-V), the runtime's split at its measured cost (the `split_backward` entry, "
    "`python -m bench.modelled.split_ops`: the deferred forward over the plain one, I + W over B); and the "
    "dispatch of the ops none of these time (bench/results/micro.json's `test_tiny_decoder_layer_forward_backward` records one real decoder "
    "layer's forward and backward beside its modelled cost: `measured_over_modelled`); the pipelines' optimizer, "
    "torch.optim.AdamW's default step (a loop over tensors on the CPU) over the slowest rank's layers at the "
    "rates `python -m bench.modelled.adam_ops` measures over the tiny model's own parameter tensors (the "
    "`adamw` entry); the backward's copies of the q/k/v and gate/up gradients into the fused projections' "
    "layout (the `stack` and `cat` of unbind and chunk) at the rate `python -m bench.modelled.layout_ops` "
    "times on those ops alone (the `layout_backward` entry). The data-parallel frameworks' own host work (ZeRO-3's module hooks, "
    "gathers and bucket copies, ZeRO-2's gradient copies, FSDP2's unit gathers and reduce-scatters, and their "
    "optimizer step) at the per-unit and per-byte costs `python -m bench.modelled.framework_ops` measures on a "
    "synthetic stack (the `framework` entry of cpu_ops.yaml). Not priced: our executors' own per-action work "
    "beyond that (p2p hand-offs on gloo, the pool's per-job bookkeeping), the round-robin pool's split backward, and the slow-down a "
    "busy machine causes a process that does hold a core (shared caches and memory bandwidth: the small-op "
    "GEMM and attention rates re-measured at load 3.5 were about 10% under cpu_ops.yaml's; `--measure-small-ops` "
    "times them in the run itself and prices on those)."
)
LOAD = (
    "Why the two errors: the measured runs share this machine's 2 cores with other agents' processes, and "
    "each timed step records the longest run-queue wait of any of its threads (Linux schedstat: runnable, "
    "but another process held the core); the profile is timed by thread CPU time, so it predicts the step "
    "without that wait, the last measured column. Taking out only the longest single wait is a lower bound "
    "on what the load cost (waits on two ranks that delay each other in turn add up), so the load-free "
    "figure is, if anything, low, and an optimistic error against it is an upper bound. The round-robin "
    "pool starts its device threads afresh each step; a watcher thread reads every thread's schedstat each "
    "20 ms (bench/measured/common.py `ThreadWatch`), so a device thread's wait counts up to its last reading."
)
CPU = (
    "A system that spends more CPU per step than the pipelines and DDP on the same FLOPs does work the model "
    "does not price (DeepSpeed's and FSDP's per-parameter hooks, partitioning and bucketing on the CPU), not slower hardware; and the pipelines' "
    "own CPU time over the model's summed F + I + W shows how much a loaded machine slows a process that "
    "holds a core (caches and memory bandwidth shared with the other processes)."
)


def calibration_section(scenario: Scenario, systems: dict, *, small_ops: dict | None = None) -> list[str]:
    """``small_ops``: the run's own small-op rates (``inrun_ops``, ``--measure-small-ops``), the model then
    priced on their mean, the committed profile's errors said beside; None: priced on the committed profile."""
    from bench.modelled.calibrate import calibration_table

    try:
        hardware = None if small_ops is None else _run_profile(small_ops)
        rows, unmodelled = calibration_rows(scenario, systems, hardware=hardware)
        committed = None if small_ops is None else calibration_rows(scenario, systems)[0]
    except ValueError as error:
        return ["## Calibration: modelled against measured", "", f"(not computed: {error})", ""]
    summary = [_spread("vs measured", [r.error for r in rows])]
    if rows and all(r.load_free_error is not None for r in rows):
        summary.append(_spread("vs measured less the wait", [r.load_free_error for r in rows]))
    waits = {n: systems[n]["wait_share"] for n in (r.system for r in rows) if systems[n].get("wait_share") is not None}
    wait_line = ("Median run-queue wait per step, share of the step: "
                 + ", ".join(f"{n} {w:.0%}" for n, w in sorted(waits.items())) + ". ") if waits else ""
    cpu = {n: r["cpu_s"] for n, r in systems.items() if r.get("cpu_s") is not None}
    cpu_line = ("Median CPU seconds per step, all of a system's processes together: "
                + ", ".join(f"{n} {c:.2f} s" for n, c in sorted(cpu.items())) + f"; the modelled F + I + W of the "
                f"step's micro-batches: {_modelled_work_s(scenario, hardware):.2f} s. " + CPU) if cpu else ""
    return [
        "## Calibration: modelled against measured (same CPU)", "",
        "Each system's cost model (bench/modelled/) on the `cpu` hardware profile measured on this machine "
        f"(`python bench/model.py --measure-cpu`: '{_profile_description()}'), at this scenario's shape, workers, "
        "sequence and batch, fp32, with the thread count each measured rank or pool device runs "
        f"({scenario.threads}). Error = modelled / measured - 1 (+: the model is optimistic).", "",
        *([] if small_ops is None else [_run_rates_line(small_ops, committed), ""]),
        calibration_table(rows), "",
        " ".join(summary) + (f" Not modelled: {', '.join(unmodelled)}." if unmodelled else ""), "",
        wait_line + LOAD, "",
        *([cpu_line, ""] if cpu_line else []),
        PHYSICS + _plan_note(scenario, systems), "",
    ]


def _plan_note(scenario: Scenario, systems: dict) -> str:
    """Whether the round-robin row compares the plan that ran with the plan the model prices: the run's own
    record (``ours.roundrobin``'s ``plan``) where the result carries it, else the plan the measured pool
    builds now (``rr_plan.build_pool``: a pure function of the scenario, so the same every build)."""
    from .rr_plan import build_pool, model_plan, plan_record, same_plan

    run = systems.get("roundrobin") or {}
    if not run.get("tokens_per_s"):
        return ""
    priced = model_plan(scenario, seq_len=scenario.seq_len)
    ran = run.get("plan")
    source = "the plan the run recorded (the result's `plan`)"
    if ran is None:
        ran = plan_record(build_pool(scenario, seq_len=scenario.seq_len))
        source = ("the plan the measured pool builds from the same costs (this result records none: "
                  "bench/measured/runner.py passes on only a run's device_peak_bytes and optimizer)")
    groups = priced["groups"]
    said = (f"forward groups {groups['forward']}, fused last group of {groups['last']}, backward groups "
            f"{groups['backward']}, {priced['microbatches_per_pool_step']} micro-batches a pool step")
    why_not = same_plan(ran, priced)
    if why_not is None:
        return (f" The round-robin pool runs the plan the model prices ({said}): it is planned from the model's "
                f"per-layer costs on this profile (bench/measured/rr_plan.py), not timed at start-up; checked "
                f"against {source}.")
    return (f" The round-robin row compares two different plans: the model prices {said}; {source} differs "
            f"({why_not}).")


def _run_profile(small_ops: dict):
    """The committed ``cpu`` profile with the run's own small-op rates (their before/after mean) in place."""
    from dataclasses import replace

    from bench.modelled.calibrate import cpu_hardware

    from .inrun_ops import mean_small_ops

    return replace(cpu_hardware(), small_ops=mean_small_ops(small_ops))


def _run_rates_line(small_ops: dict, committed_rows) -> str:
    from .inrun_ops import describe

    errors = ", ".join(f"{r.system} {r.load_free_error:+.1%}" for r in committed_rows if r.load_free_error is not None)
    return ("Priced on the small-op rates this run measured (`--measure-small-ops`: `cpu_ops.measure_small_ops` "
            "at this scenario's sizes, right before the first round and right after the last, the mean of the "
            "two; the JSON's `small_ops`), not cpu_ops.yaml's; every other figure of the profile is the committed "
            f"one. The rates: {describe(small_ops)}. On cpu_ops.yaml's rates instead, the error vs measured "
            f"less wait: {errors}.")


def _modelled_work_s(scenario: Scenario, hardware=None) -> float:
    """The modelled F + I + W of every layer over the step's micro-batches, seconds (no bubble, no optimizer)."""
    from bench.modelled.calibrate import cpu_point
    from bench.modelled.common import profile_of

    point = cpu_point(tiny_shape(scenario), hardware=hardware, gpus=scenario.workers, seq_len=scenario.seq_len,
                      micro_batch=scenario.micro_batch, global_batch=scenario.global_batch, precision="fp32")
    prof = profile_of(point, loss_chunk_tokens=None)
    return sum(layer.train_time for layer in prof.layers) * point.microbatches / 1e3


def _spread(label: str, errors: list[float]) -> str:
    if not errors:
        return ""
    size = sorted(abs(e) for e in errors)
    return f"Error {label}: median |error| {size[len(size) // 2]:.0%}, worst {max(errors, key=abs):+.0%}."


def _profile_description() -> str:
    from bench.modelled.calibrate import cpu_hardware

    try:
        return cpu_hardware().description
    except ValueError as error:
        return str(error)
