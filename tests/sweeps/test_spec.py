"""The run spec as JSON, and the limits ``amb sweep exec`` takes from an engine's allocation."""

from __future__ import annotations

import pytest

from sweeps.exec import allocation
from sweeps.spec import Agent, Cell, CellLimits, RunSpec, SpecError, decode, encode

SPEC = RunSpec(
    cell=Cell("s", "a", "bccd-det", "lite", 2),
    attempt=3,
    agent=Agent("a", ["amb-agent", "--model", "{model}"], "baseline", ["openai={baseline}"]),
    limits=CellLimits(time_limit_s=60, cpus=2, memory="4g", gpus=2),
    backend="docker",
    data="/shared/data/bccd-det",
    shard_root="/shared/sweep",
)


def test_the_spec_round_trips_and_names_its_run():
    again = decode(encode(SPEC), "spec.json")
    assert again == SPEC and again.run_id == "s-a-bccd-det-lite-r2.a3"


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace(b'"attempt": 3', b'"attempt": 3, "colour": 1'), "unknown field `colour`"),
        (lambda t: t.replace(b'"lite"', b'"pro"'), "`$.cell.tier`"),
        (lambda t: t.replace(b'"/shared/sweep"', b'"relative/dir"'), "shard_root must be an absolute path"),
        (lambda t: t.replace(b'"time_limit_s": 60', b'"time_limit_s": 0'), "time_limit_s must be positive"),
        (lambda t: t.replace(b'"v": 1', b'"v": 9'), "newer than this amb reads"),
        (lambda t: t.replace(b'"sweep": "s"', b'"sweep": "../../x"'), "invalid run id"),
        (lambda t: t[:40], "not valid JSON"),
    ],
)
def test_a_bad_spec_is_one_error_naming_the_file(edit, message):
    with pytest.raises(SpecError, match="^spec.json: ") as err:
        decode(edit(encode(SPEC)), "spec.json")
    assert message in str(err.value)


def test_gpu_ids_come_from_the_allocation_in_order():
    assert allocation(SPEC, {"AMB_GPU_IDS": "5,6,7", "SLURM_JOB_GPUS": "0,1"}).gpu_ids == ["5", "6"]
    assert allocation(SPEC, {"SLURM_JOB_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"}).gpu_ids == ["2", "3"]
    assert allocation(SPEC, {"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b"}).gpu_ids == ["GPU-a", "GPU-b"]
    with pytest.raises(SpecError, match="needs 2 GPU\\(s\\); the allocation has SLURM_JOB_GPUS='4'"):
        allocation(SPEC, {"SLURM_JOB_GPUS": "4"})
    with pytest.raises(SpecError, match="no AMB_GPU_IDS, SLURM_JOB_GPUS or CUDA_VISIBLE_DEVICES"):
        allocation(SPEC, {})


def test_cpus_and_memory_come_from_the_allocation_else_the_spec():
    env = {"AMB_GPU_IDS": "0,1"}
    assert (allocation(SPEC, env).cpus, allocation(SPEC, env).memory) == (2, "4g")
    slurm = allocation(SPEC, {**env, "SLURM_CPUS_PER_TASK": "6", "SLURM_MEM_PER_NODE": "12288"})
    assert (slurm.cpus, slurm.memory) == (6.0, "12288m")
    ours = allocation(SPEC, {**env, "AMB_CPUS": "1.5", "AMB_MEMORY": "2g", "SLURM_CPUS_PER_TASK": "6"})
    assert (ours.cpus, ours.memory) == (1.5, "2g")
    with pytest.raises(SpecError, match="AMB_CPUS='lots' is not a number"):
        allocation(SPEC, {**env, "AMB_CPUS": "lots"})
