"""Loggers named by `trainer.logger`: console, file (every metric as one JSON line per step, in
`<default_local_dir>/logs/metrics.jsonl`), tensorboard, wandb (imported only when asked for)."""
from __future__ import annotations

import json
import os
import sys

from rlx.config.schema import RLXConfig

CONSOLE_KEYS = ("critic/score/mean", "training/rollout_probs_diff_mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/vf_loss",
                "response_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step")


class Tracker:
    def __init__(self, cfg: RLXConfig, log_dir: str):
        t = cfg.trainer
        self.loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
        self.tb = self.wandb = self.file = None
        self.log_dir = log_dir
        if "file" in self.loggers:
            os.makedirs(log_dir, exist_ok=True)
            self.file = open(os.path.join(log_dir, "metrics.jsonl"), "a")
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.environ.get("TENSORBOARD_DIR", os.path.join(log_dir, "tensorboard")))
        if "wandb" in self.loggers:
            import wandb  # validated at config load: installed

            from dataclasses import asdict
            # its local files go with the other outputs (not into the working dir, lost under `ray job submit`)
            wandb_dir = os.environ.get("WANDB_DIR") or log_dir
            os.makedirs(wandb_dir, exist_ok=True)
            self.wandb = wandb.init(project=t.project_name, name=t.experiment_name, config=asdict(cfg),
                                    dir=wandb_dir)

    def log(self, metrics: dict, step: int) -> None:
        if "console" in self.loggers:
            shown = {k: v for k, v in metrics.items() if k in CONSOLE_KEYS or k.startswith("val/")}
            rest = len(metrics) - len(shown)
            line = " | ".join(f"{k}:{v:.4g}" for k, v in sorted(shown.items()))
            print(f"step:{step} | {line} | (+{rest} more metrics)", file=sys.stdout, flush=True)
        if self.file is not None:
            self.file.write(json.dumps({"step": step, **metrics}) + "\n")
            self.file.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        """Validation samples (prompt, response, score) (`trainer.log_val_generations`): printed by console, one
        JSON line in <log_dir>/val_generations.jsonl for file, a text entry for tensorboard, a table for wandb."""
        if not samples:
            return
        if "console" in self.loggers:
            lines = [f"validation generations at step {step} ({len(samples)}):"]
            for i, (prompt, response, score) in enumerate(samples):
                lines += [f"[{i}] [prompt] {prompt!r}", f"[{i}] [response] {response!r}", f"[{i}] [score] {score:.4g}"]
            print("\n".join(lines), file=sys.stdout, flush=True)
        records = [{"input": p, "output": r, "score": s} for p, r, s in samples]
        if self.file is not None:
            with open(os.path.join(self.log_dir, "val_generations.jsonl"), "a") as f:
                f.write(json.dumps({"step": step, "samples": records}) + "\n")
        if self.tb is not None:
            text = "\n\n".join(f"**prompt** {p}\n\n**response** {r}\n\n**score** {s}" for p, r, s in samples)
            self.tb.add_text("val/generations", text, step)
            self.tb.flush()
        if self.wandb is not None:
            import wandb

            table = wandb.Table(columns=["step", "input", "output", "score"],
                                data=[[step, p, r, s] for p, r, s in samples])
            self.wandb.log({"val/generations": table}, step=step)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
