"""Device call 2: the full-corpus distillation of all-MiniLM-L6-v2, tied and untied at once, on CUDA.

Env: STEPS, BATCH, SECONDS (wall-clock budget for training; a run still going then stops at its next step,
checkpoints, measures the held-out windows and saves its model, marked `stopped_early`), TEACHER (folder).
The teacher folder is the carried MiniLM files (sha256 checked); the corpus is call 1's build (sha256 checked
against the local build), staged into each run folder with the local data files' key, so the run folders
resume on the CPU machine unchanged."""
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

W = Path(os.environ.get("W", "/tmp/w"))
TEACHER = Path(os.environ.get("TEACHER", W / "teacher"))
DEVICE = os.environ.get("DEVICE", "cuda")
HERE = Path(__file__).resolve().parent
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

import unfoldformer.distill.loop as L  # noqa: E402
import unfoldformer.distill.student as S  # noqa: E402
import unfoldformer.distill.teacher as T  # noqa: E402
from unfoldformer.distill.config import DistillConfig  # noqa: E402

expected = json.loads((W / "expected.json").read_text())


def patch() -> None:
    def teacher_folder(spec="minilm"):
        return TEACHER
    T.teacher_folder = teacher_folder
    S.teacher_folder = teacher_folder
    L.dataset_files = lambda name, data_dir=None: expected["files"][name]


class Deadline(Exception):
    pass


def child(tied: bool, deadline: float) -> None:
    patch()
    out = Path("runs") / ("distill-tied" if tied else "distill-untied")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("corpus.npz",):
        if not (out / name).exists():
            os.link(W / name, out / name)
    (out / "corpus.json").write_text(json.dumps({"key": {"sources": ["sst2", "imdb"], "max_length": 128, "seed": 0,
                                                         "files": expected["files"]}, **expected["info"]}))
    cfg = DistillConfig(out=str(out), tied=tied, steps=int(os.environ["STEPS"]), batch_size=int(os.environ["BATCH"]),
                        checkpoint_every=int(os.environ.get("CKPT", "500")), log_every=50,
                        eval_every=int(os.environ.get("EVAL", "500")), device=DEVICE)
    holder = {}
    original = L._Run._train_step

    def step(self, batch):
        holder["run"] = self
        original(self, batch)
        if time.time() > deadline and self.step < self.cfg.steps:
            raise Deadline

    L._Run._train_step = step
    try:
        summary = L.distill(cfg)
    except Deadline:
        run = holder["run"]
        run._checkpoint()
        L._log(f"stopped at the time budget, step {run.step} of {run.cfg.steps}")
        planned = run.cfg.steps
        run.cfg = dataclasses.replace(run.cfg, steps=run.step)
        measures = L.held_out_measures(run.student, run.teacher, run.corpus, run.held_out, run.dist.device)
        run.rows.append({"step": run.step, "epoch": run.sampler.epoch, **measures})
        summary = run._finish()
        summary.update(stopped_early=True, planned_steps=planned)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)


def main() -> None:
    started = time.time()
    part_a, model = W / "part_a", TEACHER / "model.safetensors"
    if not model.exists():
        with open(model, "wb") as f:
            f.write(part_a.read_bytes())
            f.write((HERE / "part_b").read_bytes())
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    print("teacher sha256 ok:", digest == MINILM_SHA256, flush=True)
    if digest != MINILM_SHA256 and DEVICE == "cuda":
        sys.exit("teacher file damaged")
    deadline = started + float(os.environ["SECONDS"])
    logs = {t: open(f"runs/log-{t}.txt", "w") for t in ("tied", "untied")}
    Path("runs").mkdir(exist_ok=True)
    procs = {t: subprocess.Popen([sys.executable, __file__, t, str(deadline)], stdout=logs[t], stderr=subprocess.STDOUT)
             for t in ("tied", "untied")}
    while any(p.poll() is None for p in procs.values()):
        time.sleep(15)
        tails = {t: Path(f"runs/log-{t}.txt").read_text().strip().splitlines()[-1:] for t in procs}
        print(f"{time.time() - started:.0f} s", tails, flush=True)
    print({t: p.returncode for t, p in procs.items()}, flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        child(sys.argv[1] == "tied", float(sys.argv[2]))
    else:
        Path("runs").mkdir(exist_ok=True)
        main()
