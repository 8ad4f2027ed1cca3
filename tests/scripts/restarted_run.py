"""Train the tests' small model under torchrun for 8 steps, saving every 2, through two faults:

- in the job's first attempt, the process of rank 1 kills itself (SIGKILL) right after the checkpoint of step 4, so
  that torchrun restarts the job (`--max-restarts 1`), which resumes by itself;
- in the second attempt, at the end of step 6, the process of rank 1 sends SIGTERM to torchrun, as a scheduler
  preempting the job would; torchrun passes it on to both processes, which save checkpoint-6 and exit with status 75.

Each process writes `attempt-RANK` (the restart count it ran in) and, when preempted, `preempted-RANK` (its exit
status and checkpoint) into the folder MARKS (not the output folder, which the trainer manages).

    python -m torch.distributed.run --standalone --nproc-per-node 2 --max-restarts 1 restarted_run.py OUTPUT MARKS
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from transformers import TrainerCallback  # noqa: E402

from petra_hub.training import Preempted  # noqa: E402
from tests.training.test_trainer import make_trainer  # noqa: E402

RANK, ATTEMPT = os.environ["RANK"], int(os.environ["TORCHELASTIC_RESTART_COUNT"])


class Faults(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 4 and ATTEMPT == 0 and RANK == "1":
            os.kill(os.getpid(), signal.SIGKILL)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 6 and ATTEMPT == 1 and RANK == "1":
            os.kill(os.getppid(), signal.SIGTERM)  # torchrun, which passes it on to every process
            time.sleep(0.5)  # its own SIGTERM arrives before this step's decisions


def main(folder: str, marks: str) -> None:
    trainer = make_trainer(folder, max_steps=8, save_strategy="steps", save_steps=2, callbacks=[Faults()],
                           petra_timeout=30)
    Path(marks, f"attempt-{RANK}").write_text(str(ATTEMPT))
    try:
        trainer.train()
    except Preempted as stop:
        Path(marks, f"preempted-{RANK}").write_text(f"{stop.code} {os.path.basename(stop.checkpoint)}")
        raise


if __name__ == "__main__":
    main(*sys.argv[1:3])
