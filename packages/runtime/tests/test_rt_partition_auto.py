"""``Pipeline(..., partition="auto")``: one profile, the same cut on every rank, the model's own gradients,
and errors that say what to change; the CLI config takes ``partition: auto``."""

from __future__ import annotations

import re

import pytest
import torch

from bubbleless_runtime import Pipeline, spawn
from bubbleless_runtime import config as cfg
from bubbleless_runtime._testing import heavy_batch, heavy_model, run_cli, stages_on_one_rank, sum_mse
from bubbleless_runtime._testing.ranks import auto_against_unpipelined
from bubbleless_runtime.auto_partition import method_for, predicted_effect
from bubbleless_schedules import generate, simulate

TOLERANCE = 1e-5


@pytest.fixture(autouse=True)
def _one_thread():
    """Profiles taken with threads fighting other processes for 2 cores are slow and noisy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _auto(model, schedule, **extra):
    inputs, _ = heavy_batch(8 * schedule.num_microbatches)
    return Pipeline(model, schedule=schedule, num_microbatches=schedule.num_microbatches, loss_fn=sum_mse,
                    partition="auto", sample_input=inputs.chunk(schedule.num_microbatches)[0], **extra)


def test_rt_auto_cut_is_shared_by_every_rank_and_keeps_the_gradients():
    cases = [("1f1b", 4, 0), ("zbv", 6, 5)]  # dp on one stage per rank; v on a V placement
    per_rank = spawn(auto_against_unpipelined, 2, cases, threads_per_process=1, timeout=180)
    for name, *_ in cases:
        first = per_rank[0][name]
        for rank, seen in enumerate(per_rank):
            result = seen[name]
            # timings measured on each rank would never be bit-identical: equal costs mean one shared profile
            assert result["sizes"] == first["sizes"], (name, rank, result)
            assert result["stage_forward"] == first["stage_forward"], (name, rank, result)
            assert result["grad_error"] <= TOLERANCE, (name, rank, result)
            assert result["loss_error"] is None or result["loss_error"] <= TOLERANCE, (name, rank, result)
        assert first["sizes"] != first["even"], (name, first)
    assert per_rank[0]["1f1b"]["sizes"] == [1, 3]  # the heavy first layer alone on its stage
    zbv = per_rank[0]["zbv"]["sizes"]  # rank 0 holds chunks 0 and 3; chunk 3 is the heavy last layer
    assert zbv[0] == 1 and zbv[3] == 1, zbv


def test_rt_auto_cut_in_one_process_predicts_a_shorter_step():
    schedule = stages_on_one_rank(2)
    pipe = _auto(heavy_model(4, heavy_at=0), schedule)
    assert pipe.partition == [1, 3]
    assert len(pipe.stage_costs.forward) == 2 and pipe.stage_costs.forward[0] > pipe.stage_costs.forward[1]
    assert pipe.predicted_timeline().makespan == simulate(schedule, pipe.stage_costs).makespan
    # the same two stages on two ranks, where balance shows (on one rank the step is the total work)
    text = predicted_effect(generate("1f1b", num_ranks=2, num_microbatches=4), pipe.profile, pipe.partition)
    even, auto = (float(re.search(r"predicted step ([\d.]+) ms", line).group(1)) for line in text.splitlines()[1:])
    assert "even cut    [2, 2]" in text and "auto cut    [1, 3]" in text
    assert auto < even
    inputs, targets = heavy_batch(16)
    assert torch.isfinite(pipe.step(inputs, targets))


def test_rt_method_follows_the_placement():
    assert method_for(generate("zbv", num_ranks=2, num_microbatches=4)) == "v"
    assert method_for(generate("1f1b", num_ranks=2, num_microbatches=4)) == "dp"
    assert method_for(generate("interleaved-1f1b", num_ranks=2, num_microbatches=4)) == "dp"


def test_rt_more_stages_than_layers_raises():
    with pytest.raises(ValueError, match="the model has 2 layers but the schedule has 3 stages"):
        _auto(heavy_model(2, heavy_at=0), stages_on_one_rank(3))


def test_rt_a_memory_cap_no_cut_meets_names_the_smallest_cap_that_fits():
    schedule = stages_on_one_rank(2)
    with pytest.raises(ValueError, match="smallest cap that fits is") as caught:
        _auto(heavy_model(4, heavy_at=0), schedule, memory_cap=1000)
    smallest = int(re.search(r"smallest cap that fits is (\d+) bytes", str(caught.value)).group(1))
    assert smallest > 1000
    # the named cap is enough, and it is the smallest: memory is counted in bytes, the same every run
    pipe = _auto(heavy_model(4, heavy_at=0), schedule, memory_cap=smallest)
    assert pipe.partition == [1, 3]
    with pytest.raises(ValueError, match="smallest cap that fits"):
        _auto(heavy_model(4, heavy_at=0), schedule, memory_cap=smallest - 1)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (dict(partition="auto"), "pass sample_input="),
        (dict(partition=[2, 2], memory_cap=10**6), "memory_cap applies to partition='auto' only"),
        (dict(partition="best"), "pass 'even', 'auto', a list"),
        (dict(partition="auto", sample_input=torch.zeros(2, 16), memory_cap=-1), "must be positive"),
    ],
)
def test_rt_auto_partition_bad_arguments(extra, match):
    with pytest.raises(ValueError, match=match):
        Pipeline(heavy_model(4, heavy_at=0), schedule=stages_on_one_rank(2), num_microbatches=2,
                 loss_fn=sum_mse, **extra)


def test_rt_even_is_the_default_and_a_name():
    schedule = stages_on_one_rank(2)
    named = Pipeline(heavy_model(5, 0), schedule=schedule, num_microbatches=2, loss_fn=sum_mse, partition="even")
    default = Pipeline(heavy_model(5, 0), schedule=schedule, num_microbatches=2, loss_fn=sum_mse)
    assert named.partition == default.partition == [3, 2]
    assert default.profile is None and default.stage_costs is None


def test_rt_config_takes_partition_auto_and_a_memory_cap():
    config = cfg.load_config(text="pipeline:\n  partition: auto\n  memory_cap: 2.0e9\n")
    assert config.pipeline.partition == "auto" and config.pipeline.memory_cap == 2e9
    assert cfg.load_config(text="").pipeline.partition == "even"
    assert cfg.load_config(text="pipeline: {partition: [3, 5]}\n").pipeline.partition == [3, 5]
    with pytest.raises(ValueError, match="pipeline.partition is 'fast'"):
        cfg.load_config(text="pipeline: {partition: fast}\n")
    with pytest.raises(ValueError, match="memory_cap applies to pipeline.partition: auto only"):
        cfg.load_config(text="pipeline: {memory_cap: 1000}\n")
    with pytest.raises(ValueError, match="'pipeline.partition' expects"):
        cfg.load_config(text="pipeline: {partition: 3}\n")


@pytest.mark.slow
def test_rt_cli_partition_auto_reports_the_predicted_effect(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        "model: {vocab_size: 16, hidden_size: 32, intermediate_size: 64, num_layers: 4, num_heads: 4,\n"
        "        num_kv_heads: 2, head_dim: 8}\n"
        "data: {task: copy, num_symbols: 8, length: 4, batch_size: 8}\n"
        "pipeline: {schedule: 1f1b, nproc: 2, num_microbatches: 4, partition: auto}\n"
        "train: {steps: 2}\n"
    )
    done = run_cli(["train", str(config), "--output-dir", str(tmp_path / "out")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "partition     auto (the fastest simulated" in done.stdout
    even = next(line for line in done.stdout.splitlines() if "even cut" in line)
    auto = next(line for line in done.stdout.splitlines() if "auto cut" in line)
    assert "[3, 3]:" in even and "predicted step" in auto and "bubble" in auto
    sizes = [int(n) for n in re.search(r"\[([\d, ]+)\]", auto).group(1).split(",")]
    assert sum(sizes) == 6 and len(sizes) == 2


def test_rt_data_parallel_replicas_take_replica_0s_profile():
    from bubbleless_runtime._testing.ranks import auto_with_data_parallel

    per_rank = spawn(auto_with_data_parallel, 4, threads_per_process=1, timeout=180)
    for rank, result in enumerate(per_rank):
        assert result["sizes"] == [1, 3], (rank, result)
        assert result["stage_forward"] == per_rank[0]["stage_forward"], (rank, result)
        assert result["grad_error"] <= TOLERANCE, (rank, result)


def test_rt_layers_that_pass_tuples_are_profiled_and_train_the_same():
    from bubbleless_runtime._testing import reference_grads, relative_error, tiny_batch, tiny_loss, tiny_model

    schedule = stages_on_one_rank(2)
    inputs, targets = tiny_batch(4)
    model = tiny_model(5)  # passes (hidden, aux, index) between layers
    pipe = Pipeline(model, schedule=schedule, num_microbatches=2, loss_fn=tiny_loss, partition="auto",
                    sample_input=inputs.chunk(2)[0])
    assert sum(pipe.partition) == 5 and pipe.profile.num_layers == 5
    assert all(layer.forward > 0 and layer.weight_grad > 0 for layer in pipe.profile.layers)
    # the whole output a boundary sends: the hidden tensor (8 float32 a sample), the side sum (1 float32)
    # and the integer index (1 int64) riding beside it; the main tensor's 8 x 4 alone before
    assert pipe.profile.layers[1].output_bytes_per_token == 8 * 4 + 4 + 8
    ref_loss, ref_grads = reference_grads(tiny_model(5), inputs, targets, 2)
    loss = pipe.step(inputs, targets)
    assert relative_error(loss, ref_loss) <= TOLERANCE
    for name, p in model.named_parameters():
        assert relative_error(p.grad, ref_grads[name]) <= TOLERANCE, name


class _StartsSide(torch.nn.Module):
    """Hands on its output and a side tensor twice as wide (as MoE router statistics or rotary tables ride)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return self.linear(x), torch.zeros(x.shape[0], 2 * x.shape[1])


class _KeepsSide(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, activation):
        hidden, side = activation
        return torch.tanh(self.linear(hidden)), side


def test_rt_measure_counts_a_layers_whole_output_with_the_tensors_riding_beside_its_main_one():
    """What crosses a stage boundary is the whole output: the main tensor (8 floats a row) and the side
    tensor (16) handed on beside it; measure() counted the 8 alone."""
    from bubbleless_runtime.auto_partition import measure

    width, rows = 8, 4
    layers = [_StartsSide(width), _KeepsSide(width), _KeepsSide(width)]
    prof = measure(layers, torch.randn(rows, width), repeats=1)
    whole = [cost.output_bytes_per_token * prof.tokens_per_microbatch for cost in prof.layers]
    assert whole == [rows * (width + 2 * width) * 4] * 3
