"""What evaluate and predict return, as Trainer returns it, in one process and in two: metrics given as numpy or
torch numbers become Python numbers (a torch scalar metric failed at the first checkpoint in one process), and a
`preprocess_logits_for_metrics` returning a tuple gives a tuple of arrays (it crashed in torch.cat)."""

import numpy as np
import torch

from petra_hub.testing.ranks import run_ranks
from tests.training.test_multiprocess import as_launched
from tests.training.test_trainer import make_trainer


def metrics(prediction):
    classes, scores = prediction.predictions
    return {"accuracy": torch.tensor(float((classes == prediction.label_ids).mean())),
            "count": np.int64(len(classes)), "best_score": np.float32(scores.max())}


def both_outputs(logits, labels):
    return logits.argmax(-1), logits


def outputs(folder):
    trainer = make_trainer(folder, max_steps=2, eval_strategy="steps", eval_steps=2, save_strategy="steps",
                           save_steps=2, load_best_model_at_end=True, metric_for_best_model="accuracy")
    trainer.compute_metrics, trainer.preprocess_logits_for_metrics = metrics, both_outputs
    trainer.train()  # evaluates and saves a checkpoint at step 2 (its trainer_state.json holds the metrics)
    evaluated = trainer.evaluate()
    predicted = trainer.predict(trainer.eval_dataset)
    return {"types": {key: type(value).__name__ for key, value in evaluated.items() if "runtime" not in key
                      and "per_second" not in key},
            "predictions": [(str(array.dtype), array.shape) for array in predicted.predictions],
            "accuracy": evaluated["eval_accuracy"], "argmax": predicted.predictions[0].tolist()}


def test_one_process(tmp_path):
    result = outputs(tmp_path)
    assert result["types"] == {"eval_loss": "float", "eval_accuracy": "float", "eval_count": "int",
                               "eval_best_score": "float", "epoch": "float"}
    assert result["predictions"] == [("int64", (40,)), ("float32", (40, 10))]


def _two(rank, world_size, folder):
    as_launched(rank, world_size)
    return outputs(folder)


def test_two_processes_return_the_same_on_every_rank(tmp_path):
    results, _, _ = run_ranks(_two, 2, str(tmp_path / "two"), deadline=180)
    assert all(r is not None and "value" in r for r in results), [r and r.get("traceback") for r in results]
    first, second = results[0]["value"], results[1]["value"]
    assert first == second
    assert first["types"]["eval_count"] == "int" and first["predictions"] == [("int64", (40,)), ("float32", (40, 10))]
    assert first == outputs(tmp_path / "one")  # two processes return what one does
