"""Validation: greedy (by default) generation over the validation set, scored as training is, with verl's metrics and
generation logs. `validate(trainer)` takes the trainer (its loader, engines, reward, tracker)."""
from __future__ import annotations

import time

import numpy as np

from rlx.protocol import Batch


def select_generations(samples: list[tuple[str, str, float]], count: int) -> list[tuple[str, str, float]]:
    """verl's choice of the validation generations to log: sorted by prompt, shuffled with seed 42, the first
    `count` (the same prompts at every validation)."""
    samples = sorted(samples, key=lambda s: s[0])
    np.random.RandomState(42).shuffle(samples)
    return samples[:count]


def validate(trainer) -> dict:
    """Greedy (by default) generation over the validation set: val/<data_source>/reward/mean and, with
    `val_kwargs.n` > 1, statistics of each prompt's n samples averaged over prompts: best@n (the best of the n),
    worst@n, std@n. (verl's mean@n, the mean of each prompt's samples averaged over prompts, is the mean.)
    `trainer.log_val_generations` samples (prompt, response, score) go to the loggers."""
    per_source: dict[str, dict[str, list[float]]] = {}  # data_source -> prompt uid -> its samples' scores
    samples: list[tuple[str, str, float]] = []
    n = trainer.cfg.actor_rollout_ref.rollout.val_kwargs.n
    dump_dir = trainer.cfg.trainer.validation_data_dir
    dumped: dict[str, list] = {"inputs": [], "outputs": [], "gts": [], "scores": []}
    dumped_extras: dict[str, list] = {}  # the reward's per-response extras (a judge's verdicts), as verl's
    start = time.perf_counter()
    for prompts in trainer.val_loader:
        batch = trainer.generate(prompts, validate=True)
        scores, extra = trainer.score(batch)
        totals = scores.sum(-1).tolist()
        if dump_dir:  # verl's validation_data_dir: every validation sample, written once below
            from rlx.trainer.generations import decoded

            inputs, outputs = decoded(batch, trainer.tokenizer)
            for key, values in zip(dumped, (inputs, outputs, list(batch["ground_truth"]), totals)):
                dumped[key] += list(values)
            for key, values in extra.items():
                if len(values) == len(batch):
                    dumped_extras.setdefault(key, []).extend(values)
        for src, uid, s in zip(batch["data_source"], batch["uid"], totals):
            per_source.setdefault(str(src), {}).setdefault(uid, []).append(s)
        if trainer.cfg.trainer.log_val_generations:
            samples += decoded_samples(batch, totals, trainer.tokenizer)
    out = {}
    for src, groups in per_source.items():
        out[f"val/{src}/reward/mean"] = float(np.mean([s for g in groups.values() for s in g]))
        if n > 1:
            out[f"val/{src}/reward/best@{n}"] = float(np.mean([max(g) for g in groups.values()]))
            out[f"val/{src}/reward/worst@{n}"] = float(np.mean([min(g) for g in groups.values()]))
            out[f"val/{src}/reward/std@{n}"] = float(np.mean([np.std(g) for g in groups.values()]))
    if dump_dir:
        from rlx.trainer.generations import write_generations

        write_generations(dump_dir, trainer.global_step, **dumped, extras=dumped_extras)
    out["timing_s/testing"] = time.perf_counter() - start
    if trainer.cfg.trainer.log_val_generations:
        trainer.tracker.log_generations(select_generations(samples, trainer.cfg.trainer.log_val_generations),
                                     step=trainer.global_step)
    return out


def decoded_samples(batch: Batch, scores: list[float], tokenizer) -> list[tuple[str, str, float]]:
    """(prompt text, response text, score) of each row, decoded as the reward manager does."""
    out = []
    for prompt, resp, mask, score in zip(batch["raw_prompt"], batch["responses"], batch["response_mask"], scores):
        out.append((str(prompt), tokenizer.decode(resp[mask.bool()].tolist(), skip_special_tokens=True),
                    float(score)))
    return out
