"""Which checkpoints count, atomic records, a full disk, and run.resume's checks (no Ray: folders built here)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from recipes.errors import ConfigError
from recipes.record import records
from recipes.record.records import WriteFailed, disk_full_line, write_atomic
from recipes.run import checkpoints as ckpt
from recipes.run.resume import keep_metrics_up_to, plan_resume
from recipes.verl_ext.stability.kl_control import KLControl, KLSettings
from recipes.verl_ext.stability.tee import MetricsTee


def _checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    """A checkpoint folder shaped as verl 0.9.1 + the pack write it: a model shard, data.pt, kl_control.json."""
    folder = root / "checkpoints" / f"global_step_{step}"
    (folder / "actor").mkdir(parents=True)
    (folder / "actor" / "model_world_size_1_rank_0.pt").write_bytes(os.urandom(2 << 20))  # > HASHED_BELOW
    (folder / "data.pt").write_bytes(b"loader state %d" % step)
    KLControl(KLSettings(mode="fixed", init_loss_coef=0.001)).save(folder)
    if complete:
        ckpt.mark_complete(folder, step)
    return folder


def _run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "grpo" / "2026-12-01_12-00-00"
    run.mkdir(parents=True)
    (run / "resolved_config.yaml").write_text("trainer: {}\n")
    return run


def test_only_marked_unchanged_checkpoints_count(tmp_path):
    good2 = _checkpoint(tmp_path, 2)
    good4 = _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 6, complete=False)  # a save that did not finish
    assert ckpt.scan(tmp_path / "checkpoints").latest == (4, good4)

    model = good4 / "actor" / "model_world_size_1_rank_0.pt"
    with open(model, "r+b") as f:
        f.truncate(1000)
    found = ckpt.scan(tmp_path / "checkpoints")
    assert found.latest == (2, good2)
    reasons = dict(found.rejected)
    assert reasons[good4] == (f"actor/model_world_size_1_rank_0.pt is 1000 bytes, {2 << 20} when saved (truncated "
                              "or overwritten)")
    assert reasons[tmp_path / "checkpoints" / "global_step_6"].startswith("incomplete (3 files and no ")

    (good2 / "kl_control.json").write_text((good2 / "kl_control.json").read_text().replace("0.001", "0.002"))
    assert "kl_control.json changed since it was saved" in ckpt.problem(good2)
    assert ckpt.scan(tmp_path / "checkpoints").latest is None


def test_a_corrupted_controller_state_names_its_file(tmp_path):
    folder = _checkpoint(tmp_path, 2)
    (folder / "kl_control.json").write_text('{"state": {"loss_co')
    with pytest.raises(RuntimeError, match=r"kl_control.json: not the KL controller's state \(JSONDecodeError"):
        KLControl(KLSettings(mode="fixed", init_loss_coef=0.001)).load(folder)


def test_a_full_disk_is_one_line_naming_the_path_and_the_old_file_stays(tmp_path, monkeypatch):
    target = write_atomic(tmp_path / "bands.json", '{"old": 1}')

    class FullDisk:
        """A file whose write fails as a full disk's does (half the bytes land, then ENOSPC)."""

        def __init__(self, path, mode):
            self.f = open(path, mode)  # noqa: SIM115 - closed in __exit__

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records, "open", FullDisk, raising=False)  # the module's own open(): where the write is
    with pytest.raises(WriteFailed) as raised:
        write_atomic(target, '{"new": 2}')
    monkeypatch.undo()
    assert str(raised.value) == (f"could not write {target}: no space left on device (the file is left as it was; "
                                 "free space, then resume the run)")
    assert disk_full_line(RuntimeError("wrapped")) is None
    assert disk_full_line(raised.value) == str(raised.value)
    assert json.loads(target.read_text()) == {"old": 1} and sorted(os.listdir(tmp_path)) == ["bands.json"]
    # verl's own save in a Ray worker reaches the driver as text
    ray_text = "ray.exceptions.RayTaskError(OSError): ... OSError: [Errno 28] No space left on device: '/r/x.pt'"
    assert disk_full_line(RuntimeError(ray_text)).startswith("could not write /r/x.pt: no space left on device")
    # the pack's own record written in a Ray worker (kl_control.json, the marker): its one line crosses over
    worker_text = f"ray.exceptions.RayTaskError(WriteFailed): ...\nrecipes.record.records.WriteFailed: {raised.value}\n"
    assert disk_full_line(RuntimeError(worker_text)) == str(raised.value)


def test_resume_takes_the_last_complete_checkpoint_and_refuses_what_is_not_a_run(tmp_path):
    run = _run_folder(tmp_path)
    with pytest.raises(ConfigError, match=r"no complete checkpoint in .*none was written"):
        plan_resume(str(run), stability_auto=False)
    with pytest.raises(ConfigError, match=r"run.resume=.*: not a run folder \(no resolved_config.yaml"):
        plan_resume(str(tmp_path), stability_auto=False)
    with pytest.raises(ConfigError, match=r": no such folder"):
        plan_resume(str(tmp_path / "nope"), stability_auto=False)
    assert sorted(p.name for p in run.iterdir()) == ["resolved_config.yaml"]  # nothing created by a refusal

    good2 = _checkpoint(run, 2)
    _checkpoint(run, 4, complete=False)
    first = plan_resume(str(run), stability_auto=False)
    assert (first.step, first.checkpoint, first.record_dir) == (2, good2, run / "resume_1")
    assert first.notices == (f"checkpoint {run}/checkpoints/global_step_4 ignored: incomplete (3 files and no "
                             f"{ckpt.MARKER}: the save did not finish)",)
    assert plan_resume(str(run), stability_auto=False).record_dir == run / "resume_2"


def test_a_damaged_latest_checkpoint_is_offered_the_previous_one_or_taken_under_auto(tmp_path):
    run = _run_folder(tmp_path)
    good2 = _checkpoint(run, 2)
    bad4 = _checkpoint(run, 4)
    (bad4 / "kl_control.json").write_text("{")
    with pytest.raises(ConfigError) as refused:
        plan_resume(str(run), stability_auto=False)
    assert str(refused.value) == (
        f"run.resume={run}: the latest checkpoint {bad4} is damaged: kl_control.json is 1 bytes, "
        f"{ckpt.manifest(good2)['kl_control.json']['bytes']} when saved (truncated or overwritten); the previous "
        f"complete one is {good2}: add trainer.resume_from_path={good2} to resume from it (stability=auto takes it "
        "by itself)")
    assert plan_resume(str(run), stability_auto=True).checkpoint == good2
    assert plan_resume(str(run), stability_auto=False, chosen=str(good2)).step == 2


def test_metrics_after_the_checkpoint_move_aside_and_the_tee_appends(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "data": {"r": s}}) + "\n" for s in (1, 2, 3)) + '{"step": 4')
    assert keep_metrics_up_to(metrics, 2, tmp_path / "aside.jsonl") == 2
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2]
    assert [json.loads(line)["step"] for line in (tmp_path / "aside.jsonl").read_text().splitlines()] == [3]

    source = tmp_path / "launch.jsonl"
    source.write_text(json.dumps({"step": 3, "data": {}}) + "\n" + '{"step": 4, "da')  # the last line half written
    tee = MetricsTee(source, metrics, {"resume": 1})
    tee.pump()
    with source.open("a") as f:
        f.write('ta": {}}\n')
    tee.pump()
    tee.pump()
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["step"], r.get("resume")) for r in rows] == [(1, None), (2, None), (3, 1), (4, 1)]


def test_torchs_errno_less_checkpoint_write_failure_on_a_full_disk_is_one_line(tmp_path, monkeypatch):
    """torch.save on a full disk says neither ENOSPC nor the path ("[enforce fail at inline_container.cc:672] .
    unexpected pos 576 vs 534", seen on a 64 KiB tmpfs); the pack looks at the checkpoint folder's free space."""
    checkpoints = tmp_path / "checkpoints"  # not made yet: its nearest existing parent's disk is asked
    worker_text = ("ray.exceptions.RayTaskError(RuntimeError): ray::WorkerDict.actor_rollout_ref_save_checkpoint()\n"
                   "RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    seen = []

    def usage(path):
        seen.append(path)
        return SimpleNamespace(total=10**9, used=10**9 - 4096, free=4096)

    monkeypatch.setattr(records.shutil, "disk_usage", usage)
    line = disk_full_line(RuntimeError(worker_text), checkpoints=checkpoints)
    assert line == (f"could not write a checkpoint under {checkpoints}: no space left on device (4,096 bytes free "
                    "there; the partial checkpoint is ignored on resume; free space, then resume the run)")
    assert seen == [tmp_path]
    monkeypatch.setattr(records.shutil, "disk_usage",
                        lambda path: SimpleNamespace(total=10**12, used=0, free=10**12))
    assert disk_full_line(RuntimeError(worker_text), checkpoints=checkpoints) is None  # not a full disk: verl's error
    assert disk_full_line(RuntimeError(worker_text)) is None  # no folder to look at
    # with steps saved: the newest step folder is the one verl was writing
    monkeypatch.setattr(records.shutil, "disk_usage", usage)
    for step in (2, 10, 4):
        (checkpoints / f"global_step_{step}").mkdir(parents=True)
    assert disk_full_line(RuntimeError(worker_text), checkpoints=checkpoints) == (
        f"could not write checkpoint {checkpoints}/global_step_10: no space left on device (4,096 bytes free there; "
        "the partial checkpoint is ignored on resume; free space, then resume the run)")


def test_a_checkpoint_whose_step_was_never_logged_resumes_from_the_one_before(tmp_path):
    """Stopped between verl's save of step 4 and its log of step 4: resuming after 4 would leave row 4 missing."""
    run = _run_folder(tmp_path)
    good2, good4 = _checkpoint(run, 2), _checkpoint(run, 4)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in (1, 2, 3)))
    plan = plan_resume(str(run), stability_auto=False)
    assert (plan.step, plan.checkpoint) == (2, good2)
    assert plan.notices == (f"checkpoint {good4} has no row in metrics.jsonl (the run stopped between its save and "
                            f"its log): resuming from {good2}, steps 3-4 run again",)
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "data": {}}) + "\n" for s in (1, 2, 3, 4)))
    assert plan_resume(str(run), stability_auto=False).checkpoint == good4  # logged: taken as before
