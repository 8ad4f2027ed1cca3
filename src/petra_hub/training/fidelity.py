"""`GradientFidelityCallback`: the paper's gradient-quality measurements (its Figures 5 and 6) as a Trainer callback.

Every `every_n_steps` global steps the first micro-batch of the step is probed; once its backward has reached stage
0 (2(J-1) ticks later, a few steps on, or at the next drain), each stage's gradient for it is compared with the
end-to-end gradient at the current weights and with the delayed gradient with stashed weights
(`Pipeline.gradient_fidelity`, see `petra_hub.engine.fidelity` for the definitions and what crosses between ranks).
Training is not perturbed: a run with the callback ends bit-identical to one without.

The results go through the Trainer's loggers (`fidelity/stage_<i>/<metric>`, so `report_to="tensorboard"` draws
them) and into a JSON history, `<output_dir>/gradient_fidelity.json`, rewritten after each measurement.
"""

from __future__ import annotations

import json
import os

from transformers import TrainerCallback

from ..engine import StageFidelity

METRICS = ("cosine_true", "norm_ratio_true", "cosine_stashed", "norm_ratio_stashed", "cosine_stashed_true",
           "norm_ratio_stashed_true")
HISTORY_FILE = "gradient_fidelity.json"


class GradientFidelityCallback(TrainerCallback):
    """Measure, every `every_n_steps` steps, how close each stage's gradient is to the end-to-end gradient and to
    the stashed-weight delayed gradient. `stages`: the stage indices to report (default: all). `history_file`: the
    JSON history's name in the output directory (None: keep it in `history` only). Works with `PetraTrainer` only,
    in one process or under `accelerate launch` (every rank gets every stage's numbers)."""

    def __init__(self, every_n_steps: int = 50, stages: list[int] | None = None,
                 history_file: str | None = HISTORY_FILE):
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(
                f"GradientFidelityCallback(every_n_steps=...) must be a positive integer, got {every_n_steps!r}"
            )
        self.every_n_steps = every_n_steps
        self.stages = None if stages is None else sorted(set(stages))
        self.history_file = history_file
        self.history: list[dict] = []
        self._trainer = None

    def bind_trainer(self, trainer) -> None:
        """Called by `PetraTrainer` once its pipeline is built, before the first step."""
        num_stages = trainer.pipeline.num_stages
        if self.stages is not None and not all(0 <= index < num_stages for index in self.stages):
            raise ValueError(
                f"GradientFidelityCallback(stages={self.stages}): the pipeline has stages 0..{num_stages - 1}"
            )
        self._trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if self._trainer is None:
            raise TypeError("GradientFidelityCallback needs a PetraTrainer (it reads the PETRA pipeline's gradients)")

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step % self.every_n_steps == 0:
            self._trainer.pipeline.probe()

    def on_step_end(self, args, state, control, **kwargs):
        results = [r for r in self._trainer.pipeline.gradient_fidelity() if self._reported(r)]
        if not results:
            return
        records = [{"step": state.global_step, "epoch": state.epoch, **r.as_dict()} for r in results]
        self.history.extend(records)
        self._trainer.log(_averaged_by_stage(results))
        if self.history_file and args.should_save:
            os.makedirs(args.output_dir, exist_ok=True)
            with open(os.path.join(args.output_dir, self.history_file), "w") as handle:
                json.dump({"every_n_steps": self.every_n_steps, "metrics": list(METRICS), "records": self.history},
                          handle, indent=1)

    def _reported(self, result: StageFidelity) -> bool:
        return self.stages is None or result.stage in self.stages


def _averaged_by_stage(results: list[StageFidelity]) -> dict[str, float]:
    """One value per stage and metric (the mean over the micro-batches measured at this step)."""
    logs = {}
    for stage in sorted({r.stage for r in results}):
        mine = [r for r in results if r.stage == stage]
        for metric in METRICS:
            logs[f"fidelity/stage_{stage}/{metric}"] = sum(getattr(r, metric) for r in mine) / len(mine)
    return logs
