"""One metrics.jsonl per run, whatever verl's file logger does: it opens its file with ``"wb"`` (truncating it) each
time a trainer starts, so a restarted attempt or a resumed run points it at a file of its own and the lines are
appended from there to the run's ``metrics.jsonl``, tagged (``attempt``, ``resume``). The progress printer and the
bands monitor follow that one file."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

from omegaconf import OmegaConf

from recipes.record.records import WriteFailed

LOGGER_ENV = "VERL_FILE_LOGGER_PATH"
ENV_VARS = "ray_kwargs.ray_init.runtime_env.env_vars"


class MetricsTee:
    """Appends the complete lines ``source`` gained since the last pump to ``target``, each row with ``tags``."""

    def __init__(self, source: Path, target: Path, tags: dict):
        self.source, self.target, self.tags, self._done = Path(source), Path(target), dict(tags), 0

    def pump(self) -> None:
        if not self.source.is_file():
            return
        lines = self.source.read_text().splitlines(keepends=True)
        complete = [line for line in lines if line.endswith("\n")]
        new = complete[self._done:]
        if not new:
            return
        out = []
        for line in new:
            try:
                out.append(json.dumps({**json.loads(line), **self.tags}) + "\n")
            except json.JSONDecodeError:
                continue
        try:
            with self.target.open("a") as f:
                f.write("".join(out))
        except OSError as error:
            raise WriteFailed(self.target, error) from None
        self._done = len(complete)


@contextlib.contextmanager
def teed_metrics(cfg, source: Path, target: Path, tags: dict, interval: float = 0.5):
    """For the block, verl's file logger writes ``source`` (the config's worker env and this process's), and a
    thread appends its lines to ``target``; the last lines are appended when the block ends."""
    OmegaConf.update(cfg, f"{ENV_VARS}.{LOGGER_ENV}", str(source), force_add=True)
    previous = os.environ.get(LOGGER_ENV)
    os.environ[LOGGER_ENV] = str(source)
    tee, stop = MetricsTee(source, target, tags), threading.Event()

    def follow():
        while not stop.wait(interval):
            tee.pump()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield tee
    finally:
        stop.set()
        thread.join(timeout=5)
        tee.pump()
        if previous is None:
            os.environ.pop(LOGGER_ENV, None)
        else:
            os.environ[LOGGER_ENV] = previous
