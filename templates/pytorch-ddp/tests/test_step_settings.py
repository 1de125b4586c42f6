"""Every decision the engine takes for a GPU, checked without one: the precision and its autocast
dtype, the gradient scaler (fp16 only, and what its state in a checkpoint is), pinned memory,
the fused optimizer, compile, no DDP wrapper in a job of one process, the votes every
rank reads a step late, the metrics sent from a thread of their own, and the defaults the engine
shares with its template. Each rule is the one torch documents (step_settings.py cites them);
tests/test_gpu.py runs the same decisions on a GPU.
"""
import os
import re
import threading
import time

import pytest
import torch
from torch import nn

import step_settings
import train
from fake_trainyard import FakeTrainyard

TEMPLATE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "template.yaml")


@pytest.mark.parametrize("precision, device, dtype, scaler", [
    ("fp32", "cuda", None, False),
    ("bf16", "cuda", torch.bfloat16, False),
    ("fp16", "cuda", torch.float16, True),
    ("fp32", "cpu", None, False),
    ("bf16", "cpu", torch.bfloat16, False),
])
def test_each_precision_autocasts_to_its_dtype_and_only_fp16_scales_gradients(precision, device, dtype, scaler):
    settings = step_settings.step_settings(precision, False, device)
    assert settings.precision == precision and settings.notes == ()
    assert settings.autocast_dtype == dtype
    assert settings.grad_scaler is scaler, "bf16 has fp32's exponent range: only fp16's small gradients underflow"


def test_fp16_falls_back_to_bf16_on_cpu_where_there_is_no_gradient_scaler():
    settings = step_settings.step_settings("fp16", False, "cpu")
    assert (settings.precision, settings.autocast_dtype, settings.grad_scaler) == ("bf16", torch.bfloat16, False)
    assert settings.notes == ("fp16 needs a GPU; using bf16 on CPU",)


def test_bf16_on_a_gpu_without_native_bf16_falls_back_to_fp16_with_the_scaler():
    settings = step_settings.step_settings("bf16", False, "cuda", bf16_supported=False)
    assert (settings.precision, settings.autocast_dtype, settings.grad_scaler) == ("fp16", torch.float16, True)
    assert "no native bf16" in settings.notes[0]
    # fp32 and fp16 need no bf16.
    assert step_settings.step_settings("fp16", False, "cuda", bf16_supported=False).notes == ()


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="fp8"):
        step_settings.step_settings("fp8", False, "cuda")


def test_batches_are_pinned_and_adamw_fused_on_a_gpu_only():
    gpu, cpu = (step_settings.step_settings("bf16", False, d) for d in ("cuda", "cpu"))
    assert gpu.pin_memory and not cpu.pin_memory, "pinned memory makes the copy to a GPU asynchronous"
    assert step_settings.optimizer_options(gpu) == {"fused": True}
    assert step_settings.optimizer_options(cpu) == {}


def test_compile_is_the_parameter_on_every_device():
    for device in ("cuda", "cpu"):
        assert step_settings.step_settings("bf16", True, device).compile
        assert not step_settings.step_settings("bf16", False, device).compile


def test_the_engine_line_names_every_decision():
    settings = step_settings.step_settings("fp16", True, "cuda")
    assert step_settings.describe(settings, torch.device("cuda", 0), "nccl") == (
        "engine: cuda:0 over nccl; fp16 (autocast torch.float16); gradient scaler on; compile on; "
        "pinned memory on; fused AdamW")
    settings = step_settings.step_settings("fp32", False, "cpu")
    assert step_settings.describe(settings, torch.device("cpu"), "gloo") == (
        "engine: cpu over gloo; fp32 (no autocast); gradient scaler off; compile off; pinned memory off; AdamW")


def test_autocast_computes_in_the_dtype_the_settings_name():
    """torch.autocast on the CPU (bf16): the same call the engine makes, on a layer autocast
    lowers (nn.Linear) and one it keeps in fp32 (a softmax-based loss)."""
    settings = step_settings.step_settings("bf16", False, "cpu")
    layer, x = nn.Linear(8, 4), torch.randn(2, 8)
    with torch.autocast("cpu", dtype=settings.autocast_dtype, enabled=settings.autocast_dtype is not None):
        out = layer(x)
        loss = nn.functional.cross_entropy(out, torch.tensor([0, 1]))
    assert out.dtype == torch.bfloat16 and loss.dtype == torch.float32
    fp32 = step_settings.step_settings("fp32", False, "cpu")
    with torch.autocast("cpu", dtype=fp32.autocast_dtype, enabled=fp32.autocast_dtype is not None):
        assert layer(x).dtype == torch.float32


def test_a_disabled_gradient_scaler_saves_nothing_and_loads_nothing():
    """GradScaler.state_dict: "Returns an empty dict if this instance is not enabled"; the engine
    then skips loading it (a checkpoint of another precision resumes with a fresh scaler)."""
    disabled = torch.amp.GradScaler("cuda", enabled=False)
    assert disabled.state_dict() == {}
    disabled.load_state_dict({"scale": 1024.0})  # ignored when disabled


def test_only_a_job_of_several_processes_wraps_its_model_in_ddp():
    assert not train.wraps_in_ddp(1)
    assert train.wraps_in_ddp(2) and train.wraps_in_ddp(64)


def test_votes_are_read_one_step_late_alike_on_every_rank(monkeypatch):
    """One rank's sum is its own vote (dist.all_reduce over one rank does nothing)."""
    monkeypatch.setattr(train.dist, "all_reduce", lambda tensor: None)
    votes = train.StepVotes("cpu", 2)
    assert votes.collect() == (0.0, 0.0), "nothing cast before the first step"
    votes.cast(True, False)
    assert votes.collect() == (1.0, 0.0)
    assert votes.collect() == (0.0, 0.0), "each step's sums are read once"
    votes.cast(False, True)
    with pytest.raises(ValueError):
        votes.cast(False, False)  # the previous sums were not read
    assert votes.collect() == (0.0, 1.0)


def test_metrics_are_posted_from_a_thread_of_their_own_and_close_waits_for_them(monkeypatch):
    trainyard = FakeTrainyard()
    try:
        for key, value in trainyard.env().items():
            monkeypatch.setenv(key, value)
        reporter, posting = train.Reporter(True), []
        post = reporter._post

        def slow_post(points):
            posting.append(threading.current_thread().name)
            time.sleep(0.5)
            return post(points)

        reporter._post = slow_post
        reporter.add(10, loss=1.5, lr=0.1)
        began = time.monotonic()
        reporter.flush()
        assert time.monotonic() - began < 0.2, "the training loop does not wait for the server"
        reporter.add(20, loss=1.25)
        reporter.close()
        assert trainyard.series("loss") == [(10, 1.5), (20, 1.25)]
        assert posting and all(name == "trainyard-metrics" for name in posting)
    finally:
        trainyard.close()


def test_points_a_post_failed_to_deliver_go_with_the_next(monkeypatch):
    monkeypatch.setenv("TRAINYARD_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("TRAINYARD_TOKEN", "t")
    monkeypatch.setenv("TRAINYARD_JOB_ID", "j")
    reporter, sent, answers = train.Reporter(True), [], [False, True]
    reporter._post = lambda points: sent.append(list(points)) or answers.pop(0)
    reporter.add(1, loss=2.0)
    reporter.flush()
    reporter.add(2, loss=1.0)
    reporter.close()
    assert [[p["step"] for p in batch] for batch in sent] == [[1], [1, 2]]


def test_the_engines_defaults_are_the_templates():
    """A parameter left out runs the engine as the template runs it; the exceptions describe what
    only Trainyard gives a job (its replica's resources, a tenant volume, the job folder's path
    to the built-in example)."""
    yaml = pytest.importorskip("yaml")
    with open(TEMPLATE) as f:
        template = yaml.safe_load(f)
    engine = vars(train.parse_args(["--data=unused"]))
    differ_on_purpose = {
        "user_module": ("template/engine/example.py", ""),   # both: the built-in example
        "checkpoint_volume": ("checkpoints", ""),            # a tenant volume Trainyard makes
        "cpu": (2, 0),                                       # the replica's; 0: not given
        "memory": ("4Gi", ""),
    }
    compared = []
    for arg in template["args"]:
        match = re.fullmatch(r"--([a-z-]+)=\{\{ (\w+)(?: \| lower)? \}\}", arg)
        assert match, arg
        option, name = match.group(1).replace("-", "_"), match.group(2)
        default = template["parameters"][name].get("default")
        if default is None:
            continue  # required
        if isinstance(default, bool):
            default = str(default).lower()
        if name in differ_on_purpose:
            assert (default, engine[option]) == differ_on_purpose[name], name
            continue
        assert engine[option] == default, f"{name}: the template's {default!r}, the engine's {engine[option]!r}"
        compared.append(name)
    assert "precision" in compared and engine["precision"] == "bf16"
