"""The modelled-vs-measured table (issue 10, section 3, calibration): each measured system's tokens/s
against what its cost model predicts on the ``cpu`` hardware profile measured on this machine
(bench/modelled/cpu.yaml), at the scenario's shape, workers, sequence and batch, in fp32."""

from __future__ import annotations

from bubbleless_partition import TransformerShape

from .scenario import Scenario


def tiny_shape(scenario: Scenario) -> TransformerShape:
    m = scenario.model
    return TransformerShape(name=f"{scenario.name} (measured scenario)", num_layers=m.layers, hidden=m.hidden,
                            intermediate=m.intermediate, heads=m.heads, kv_heads=m.heads, vocab=m.vocab)


def calibration_rows(scenario: Scenario, systems: dict):
    from bench.modelled import systems as modelled_systems
    from bench.modelled.calibrate import calibrate, cpu_point

    known = {n for n, s in modelled_systems().items() if s.modelled is not None}
    measured = {n: r["tokens_per_s"] for n, r in systems.items() if n in known and r.get("tokens_per_s")}
    point = cpu_point(tiny_shape(scenario), gpus=scenario.workers, seq_len=scenario.seq_len,
                      micro_batch=scenario.micro_batch, global_batch=scenario.global_batch, precision="fp32")
    return calibrate(measured, point=point), sorted(set(systems) - known)


def calibration_section(scenario: Scenario, systems: dict) -> list[str]:
    from bench.modelled.calibrate import calibration_table

    try:
        rows, unmodelled = calibration_rows(scenario, systems)
    except ValueError as error:
        return ["## Calibration: modelled against measured", "", f"(not computed: {error})", ""]
    errors = [abs(r.error) for r in rows]
    return [
        "## Calibration: modelled against measured (same CPU)", "",
        "Each system's cost model (bench/modelled/) on the `cpu` hardware profile measured on this machine "
        "(`python bench/model.py --measure-cpu`: GEMM rate, memory copy, torch AdamW), at this scenario's "
        "shape, workers, sequence and batch, fp32. Error = modelled / measured - 1 (+: the model is optimistic).", "",
        calibration_table(rows), "",
        (f"Median |error| {sorted(errors)[len(errors) // 2]:.0%}, worst {max(errors):.0%}. " if errors else "")
        + (f"Not modelled: {', '.join(unmodelled)}. " if unmodelled else "")
        + ("Why every model is optimistic: " if rows and all(r.error > 0 for r in rows) else "What the models leave out: ")
        + "the `cpu` profile was measured as "
        + f"'{_profile_description()}' ({_gemm_source()}), the thread count each measured rank or pool device "
        + f"runs ({scenario.threads}); the analytic profile "
          "(bubbleless_partition.analytic) prices matrix multiplies and attention at that GEMM rate and leaves "
          "out norms, activations and residual adds, memory-bound work that is not small on a CPU at this "
          "width; the profile prices gloo transfers as memory copies; and the measured runs share this "
          "machine's 2 cores with whatever else runs (the alternating rounds spread that load over the "
          "systems, they do not remove it), while the profile's short timed GEMMs can catch a free core. "
          "The executor's own overhead is not the cause: the "
          "micro-benchmarks (bench/results/micro.json) put it near 40 microseconds per action. The models "
          "were built for GPUs, where GEMMs dominate; they are not refitted to these numbers.", "",
    ]


def _gemm_source() -> str:
    from bench.modelled.calibrate import cpu_hardware

    try:
        return cpu_hardware().sources["sustained_tflops"].split(": ", 1)[-1]
    except (ValueError, KeyError):
        return "GEMM not recorded"


def _profile_description() -> str:
    from bench.modelled.calibrate import cpu_hardware

    try:
        return cpu_hardware().description
    except ValueError as error:
        return str(error)
