"""Loggers named by `trainer.logger`: console, file (every metric as one JSON line per step, in
`<default_local_dir>/logs/metrics.jsonl`), tensorboard, wandb, swanlab (imported only when asked for; swanlab is
the optional extra `rlx[swanlab]`).

wandb works without an account: with no API key (WANDB_API_KEY unset, no `wandb login` entry in the netrc file)
the run logs offline into the run's folder and says so in one line, with the `wandb sync` command that uploads it
later; with a key it logs online. WANDB_MODE, when set, decides instead (online | offline | disabled). swanlab the
same way: SWANLAB_API_KEY or `swanlab login`, else offline into the run's folder (SWANLAB_LOG_DIR, when set, instead)
with the `swanlab sync` command; SWANLAB_MODE, when set, decides (online | offline | local | disabled)."""
from __future__ import annotations

import json
import netrc
import os
import sys
import time
from typing import Any
from urllib.parse import urlsplit

from rlx.config.schema import RLXConfig

CONSOLE_KEYS = ("critic/score/mean", "training/rollout_probs_diff_mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/vf_loss",
                "response_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step")


class Tracker:
    def __init__(self, cfg: RLXConfig, log_dir: str):
        t = cfg.trainer
        self.loggers = [t.logger] if isinstance(t.logger, str) else list(t.logger)
        self.tb = self.wandb = self.swanlab = self.file = None
        self.log_dir = log_dir
        if "file" in self.loggers:
            os.makedirs(log_dir, exist_ok=True)
            self.file = open(os.path.join(log_dir, "metrics.jsonl"), "a")
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.environ.get("TENSORBOARD_DIR", os.path.join(log_dir, "tensorboard")))
        if "wandb" in self.loggers:
            self.wandb = init_wandb(cfg, log_dir)
        if "swanlab" in self.loggers:
            self.swanlab = init_swanlab(cfg, log_dir)

    def log(self, metrics: dict, step: int) -> None:
        if "console" in self.loggers:
            shown = {k: v for k, v in metrics.items() if k in CONSOLE_KEYS or k.startswith("val/")}
            rest = len(metrics) - len(shown)
            line = " | ".join(f"{k}:{v:.4g}" for k, v in sorted(shown.items()))
            print(f"step:{step} | {line} | (+{rest} more metrics)", file=sys.stdout, flush=True)
        if self.file is not None:
            self.file.write(json.dumps({"step": step, "wall_time": time.time(), **metrics}) + "\n")
            self.file.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.swanlab is not None:
            self.swanlab.log(metrics, step=step)

    def log_generations(self, samples: list[tuple[str, str, float]], step: int) -> None:
        """Validation samples (prompt, response, score) (`trainer.log_val_generations`): printed by console, one
        JSON line in <log_dir>/val_generations.jsonl for file, a text entry for tensorboard, a table for wandb and
        swanlab."""
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
        if self.swanlab is not None:
            import swanlab

            table = swanlab.echarts.Table()
            table.add(headers=["step", "input", "output", "score"], rows=[[step, p, r, s] for p, r, s in samples])
            self.swanlab.log({"val/generations": table}, step=step)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
        if self.swanlab is not None:
            self.swanlab.finish()


def wandb_has_credentials() -> bool:
    """True when wandb would find an API key on its own: WANDB_API_KEY (or WANDB_IDENTITY_TOKEN_FILE), or an entry
    for the W&B host (WANDB_BASE_URL, default api.wandb.ai) in the netrc file that `wandb login` writes (NETRC, else
    ~/.netrc)."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlsplit(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").netloc
    path = os.path.expanduser(os.environ.get("NETRC") or "~/.netrc")
    try:
        entry = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def init_wandb(cfg: RLXConfig, log_dir: str):
    """`wandb.init` as verl calls it (project = trainer.project_name, run name = trainer.experiment_name, entity =
    WANDB_ENTITY, the whole config), its local files under WANDB_DIR or `log_dir` (with the run's other outputs, not
    the working dir that `ray job submit` deletes). Without WANDB_MODE and without credentials: offline, quiet,
    and one line naming the run's folder and the command that uploads it."""
    from dataclasses import asdict

    try:
        import wandb
    except ImportError as e:  # a dependency of rlx: only a broken install gets here
        raise RuntimeError(f"trainer.logger has wandb but `import wandb` fails ({e}). Fix: pip install wandb, or drop "
                           f"wandb from trainer.logger.") from e

    t = cfg.trainer
    wandb_dir = os.environ.get("WANDB_DIR") or log_dir
    os.makedirs(wandb_dir, exist_ok=True)
    offline = not os.environ.get("WANDB_MODE") and not wandb_has_credentials()
    kwargs: dict[str, Any] = dict(mode="offline", settings=wandb.Settings(silent=True)) if offline else {}
    run = wandb.init(project=t.project_name, name=t.experiment_name, entity=os.environ.get("WANDB_ENTITY"),
                     config=asdict(cfg), dir=wandb_dir, **kwargs)
    if offline:
        run_dir = os.path.dirname(run.dir)  # run.dir is the run's files/ folder
        print(f"rlx: wandb has no API key (WANDB_API_KEY unset, no `wandb login`): logging offline to {run_dir}; "
              f"upload it later with: wandb sync {run_dir}", file=sys.stderr, flush=True)
    return run


SWANLAB_MISSING = ("trainer.logger=swanlab needs the swanlab package, an optional extra of rlx that is not installed. "
                   "Fix: pip install swanlab (or pip install 'rlx[swanlab]'), or drop swanlab from trainer.logger.")


def swanlab_has_credentials() -> bool:
    """True when swanlab would find an API key on its own: SWANLAB_API_KEY, or the entry `swanlab login` saves
    (swanlab's own lookup: .swanlab/.netrc under the working dir, then under SWANLAB_ROOT or ~/.swanlab)."""
    import swanlab

    return bool(swanlab.Settings().api_key)


def init_swanlab(cfg: RLXConfig, log_dir: str):
    """`swanlab.init` as verl calls it (project = trainer.project_name, experiment = trainer.experiment_name, the whole
    config), its files under SWANLAB_LOG_DIR or `log_dir` (with the run's other outputs), never prompting (a Ray job
    has no terminal to answer on). Without SWANLAB_MODE and without credentials: offline, and one line naming the
    run's folder and the command that uploads it."""
    from dataclasses import asdict

    try:
        import swanlab
    except ImportError as e:  # validation refuses this before Ray starts; a direct Tracker user gets here
        raise RuntimeError(f"{SWANLAB_MISSING} ({e})") from e

    t = cfg.trainer
    swanlab_dir = os.environ.get("SWANLAB_LOG_DIR") or log_dir
    os.makedirs(swanlab_dir, exist_ok=True)
    offline = not os.environ.get("SWANLAB_MODE") and not swanlab_has_credentials()
    run = swanlab.init(project=t.project_name, experiment_name=t.experiment_name, config=asdict(cfg),
                       log_dir=swanlab_dir, mode="offline" if offline else None,
                       settings=swanlab.Settings(interactive=False))
    if offline:
        print(f"rlx: swanlab has no API key (SWANLAB_API_KEY unset, no `swanlab login`): logging offline to "
              f"{run.dir}; upload it later with: swanlab sync {run.dir}", file=sys.stderr, flush=True)
    return run
