"""Resumable fits: a fit killed mid-way and resumed equals an uninterrupted one."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from engine.api import fit
from engine.cli import main
from engine.data.blocks import InMemorySource
from engine.data.kinds import source_for
from engine.data.store import write_store
from engine.errors import SettingsError
from engine.infer.checkpoint import CHECKPOINT_FILE, Checkpointer
from engine.infer.fit import fit_source
from engine.infer.settings import FitSettings
from engine.models import get_model
from engine.run import load_run

ROOT = Path(__file__).resolve().parents[3]


def _matrix(num_subjects, num_items, seed):
    rng = np.random.default_rng(seed)
    theta, b = rng.normal(size=num_subjects), rng.normal(size=num_items)
    a = np.exp(0.3 * rng.normal(size=num_items))
    y = (rng.random((num_subjects, num_items)) < 1 / (1 + np.exp(-a * (theta[:, None] - b))))
    y = y.astype(np.int8)
    y[rng.random(y.shape) < 0.1] = -1
    return y


class _Interrupt(Exception):
    pass


def _interrupt_resume_and_compare(spec, source, settings, ckpt, stop_after, check_saved=None):
    """Interrupt a checkpointed fit after ``stop_after`` passes (then call ``check_saved``),
    resume it, and check it equals one uninterrupted fit; returns ``(resumed, whole)``."""
    def stop(i, record):
        if i + 1 == stop_after:
            raise _Interrupt

    with pytest.raises(_Interrupt):
        fit_source(spec, source, settings, checkpointer=ckpt, progress_fn=stop)
    if check_saved is not None:
        check_saved()
    resumed = fit_source(spec, source, settings, checkpointer=ckpt, resume=True)
    whole = fit_source(spec, source, settings)
    assert [r["elbo"] for r in resumed.trace] == pytest.approx([r["elbo"] for r in whole.trace])
    for k in whole.guide.loc:
        np.testing.assert_allclose(resumed.guide.loc[k], whole.guide.loc[k], atol=1e-6, err_msg=k)
        np.testing.assert_allclose(resumed.guide.log_scale[k], whole.guide.log_scale[k], atol=1e-6)
    return resumed, whole


def test_adam_resume_restores_optimizer_state(tmp_path):
    """Interrupted after a checkpoint, resumed: the same guide as one uninterrupted fit
    (Gamma-IRT on positive scores, the model that declares Adam)."""
    rng = np.random.default_rng(1)
    y = rng.gamma(2.0, 0.5, size=(60, 90)).astype(np.float32)
    spec, source = get_model("gamma"), source_for(y, 1 << 22)
    settings = FitSettings(optimizer="adam", max_passes=9, min_passes=9, seed=3, checkpoint_every=3)
    ckpt = Checkpointer(tmp_path, settings.checkpoint_every, {"case": "adam"})
    def saved_at_pass_3():
        saved = json.loads((tmp_path / CHECKPOINT_FILE).read_text())
        assert saved["passes"] == 3 and len(list(tmp_path.glob("checkpoint-*.npz"))) == 1

    resumed, whole = _interrupt_resume_and_compare(spec, source, settings, ckpt, stop_after=5,
                                                   check_saved=saved_at_pass_3)
    assert resumed.num_passes == whole.num_passes == 9
    with pytest.raises(SettingsError, match="different fit"):
        fit_source(spec, source, settings, resume=True,
                   checkpointer=Checkpointer(tmp_path, 3, {"case": "other"}))


def test_newton_resume_restores_the_running_cross_curvatures(tmp_path):
    """The Newton state (running cross curvatures, used after ``unbiased_after`` steps)
    is checkpointed: a fit resumed after that point equals an uninterrupted one. A
    checkpoint in another format is refused with a clear error."""
    y = _matrix(60, 90, seed=2)
    spec, source = get_model("2pl"), InMemorySource(y)
    settings = FitSettings(max_passes=12, min_passes=12, seed=4, checkpoint_every=8,
                           unbiased_after=4)
    ckpt = Checkpointer(tmp_path, settings.checkpoint_every, {"case": "newton"})
    _interrupt_resume_and_compare(spec, source, settings, ckpt, stop_after=10)
    info = json.loads((tmp_path / CHECKPOINT_FILE).read_text())
    info["format_version"] = 1
    (tmp_path / CHECKPOINT_FILE).write_text(json.dumps(info))
    with pytest.raises(SettingsError, match="format 1.*--overwrite"):
        fit_source(spec, source, settings, checkpointer=ckpt, resume=True)


def _cli_env():
    return dict(os.environ, JAX_PLATFORMS="cpu",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def test_killed_cli_fit_resumes_to_the_uninterrupted_result(tmp_path):
    y = _matrix(400, 2000, seed=2)
    store = write_store(y, [f"s{k}" for k in range(400)], [f"i{k}" for k in range(2000)],
                        tmp_path / "store.zarr")
    run = tmp_path / "run"
    args = [str(store.path), "--out", str(run), "--model", "2pl", "--seed", "4", "--tol", "1e-9",
            "--max-passes", "40", "--checkpoint-every", "2", "--quiet", "--draws", "50"]
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "fit", *args], env=_cli_env(),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while not (run / CHECKPOINT_FILE).exists() and proc.poll() is None:
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    killed_at = json.loads((run / CHECKPOINT_FILE).read_text())["passes"]
    assert not (run / "fit.json").exists() and killed_at < 40
    print("killed after checkpoint at pass", killed_at)

    assert main(["fit", *args]) == 2  # a checkpoint is there: --resume or --overwrite
    assert main(["fit", *args[:-2], "--seed", "5", "--resume"]) == 2  # another fit's settings
    assert main(["fit", *args, "--resume"]) == 0
    resumed = load_run(run)
    assert not (run / CHECKPOINT_FILE).exists()  # the finished run replaced the checkpoint
    whole = fit(store, "2pl", FitSettings(max_passes=40, tol=1e-9, seed=4))
    assert resumed.info["num_passes"] == whole.num_passes
    assert [r["elbo"] for r in resumed.info["elbo_trace"]] == pytest.approx(
        [r["elbo"] for r in whole.trace], rel=1e-6)
    for k in whole.guide.loc:
        np.testing.assert_allclose(resumed.guide.loc[k], whole.guide.loc[k], atol=1e-5, err_msg=k)
    assert main(["fit", *args, "--resume"]) == 2  # finished: refuses to overwrite the run


def test_bad_memory_budget_is_a_clear_error(tmp_path, capsys):
    store = write_store(_matrix(10, 20, seed=0), [f"s{k}" for k in range(10)],
                        [f"i{k}" for k in range(20)], tmp_path / "s.zarr")
    assert main(["fit", str(store.path), "--out", str(tmp_path / "r"), "--memory-budget", "lots",
                 "--quiet"]) == 2
    assert "memory budget 'lots' is not a size; write it like 512M" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_resume_with_a_larger_pass_cap_continues_the_fit(tmp_path):
    """A capped fit resumed with a larger max_passes continues to the uncapped result."""
    y = _matrix(50, 80, seed=6)
    store = write_store(y, [f"s{k}" for k in range(50)], [f"i{k}" for k in range(80)],
                        tmp_path / "s.zarr")
    settings = FitSettings(max_passes=4, min_passes=4, seed=2, checkpoint_every=1,
                           ability_factor="gaussian")  # the path that checkpoints
    capped = fit(store, "2pl", settings, checkpoint_dir=tmp_path / "ckpt")
    assert capped.num_passes == 4
    longer = settings.replace(max_passes=8, min_passes=8)
    resumed = fit(store, "2pl", longer, checkpoint_dir=tmp_path / "ckpt", resume=True)
    whole = fit(store, "2pl", longer.replace(checkpoint_every=0))
    assert resumed.num_passes == whole.num_passes == 8
    for k in whole.guide.loc:
        np.testing.assert_allclose(resumed.guide.loc[k], whole.guide.loc[k], atol=1e-5, err_msg=k)
    with pytest.raises(SettingsError, match="differs in settings"):
        fit(store, "2pl", longer.replace(seed=3), checkpoint_dir=tmp_path / "ckpt", resume=True)
