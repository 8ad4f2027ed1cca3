"""Coarser pipelines: `merge_stages` by count or by explicit group sizes."""

import pytest

from petra_hub.engine import Mode, Pipeline, StageGroup, merge_stages, stage_layout
from petra_hub.testing.models import small_model

from .test_pipeline import assert_frozen_weights_give_the_backprop_gradient, cross_entropy, micro_batches


def test_groups_by_count_are_even_and_by_sizes_are_as_given():
    stages = small_model("revnet18").get_stages()  # S R R D R D R D R H
    assert [len(getattr(s, "members", [s])) for s in merge_stages(stages, 3)] == [4, 3, 3]
    merged = merge_stages(stages, [1, 2, 7])
    assert merged[0] is stages[0]
    assert isinstance(merged[1], StageGroup) and list(merged[1].members) == stages[1:3]
    assert [s.reversible for s in merged] == [False, True, False]  # the two reversible blocks stay reversible
    assert stage_layout(merged) == "SRH"
    assert merge_stages(stages, len(stages)) == stages


@pytest.mark.parametrize("groups", [[1, 2, 6], [0, 3, 7], [1, 2.0, 7], [], 0, 11])
def test_impossible_groupings_are_refused_with_the_sizes(groups):
    stages = small_model("revnet18").get_stages()
    with pytest.raises(ValueError, match="stage"):
        merge_stages(stages, groups)


@pytest.mark.parametrize("groups", [[1, 2, 7], [4, 6], [1, 2, 1, 6]])
def test_petra_on_grouped_stages_gives_the_backprop_gradient(groups):
    model = small_model("revnet18")
    model.train()
    stages = merge_stages(model.get_stages(), groups)
    assert_frozen_weights_give_the_backprop_gradient(model, micro_batches(model.config, 6), Mode.PETRA, stages)


def test_a_reversible_group_holds_no_input_between_ticks():
    model = small_model("revnet18")
    stages = merge_stages(model.get_stages(), [1, 2, 7])
    pipeline = Pipeline(stages, cross_entropy, mode="petra")
    for images, labels in micro_batches(model.config, 6):
        pipeline.step(images, labels)
        held = {index: stats.activation_bytes for index, stats in pipeline.memory().items()}
        assert held[1] == 0  # the reversible group rebuilds its input
    assert held[0] > 0  # the stem stores its input for its delay
    pipeline.drain()
