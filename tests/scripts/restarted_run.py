"""Train the tests' small model under torchrun, saving every 2 steps; in the job's first attempt the process of rank 1
kills itself (SIGKILL) right after the checkpoint of step 4, so that torchrun restarts the job. Process 0 then
writes the trained weights (safetensors) and the restart count into the output folder.

    python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1 restarted_run.py FOLDER
"""

import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from safetensors.torch import save_file  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from tests.training.test_trainer import make_trainer  # noqa: E402


class KilledInTheFirstAttempt(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
        if state.global_step == 4 and first_attempt and os.environ["RANK"] == "1":
            os.kill(os.getpid(), signal.SIGKILL)


def main(folder: str) -> None:
    trainer = make_trainer(folder, max_steps=8, save_strategy="steps", save_steps=2,
                           callbacks=[KilledInTheFirstAttempt()], petra_timeout=30)
    trainer.train()
    if os.environ["RANK"] == "0":
        save_file({name: value.contiguous() for name, value in trainer.model.state_dict().items()},
                  str(Path(folder, "trained.safetensors")))
        Path(folder, "restarts").write_text(os.environ["TORCHELASTIC_RESTART_COUNT"])


if __name__ == "__main__":
    main(sys.argv[1])
