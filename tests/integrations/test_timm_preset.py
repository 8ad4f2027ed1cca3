"""`preset` is not an argument of the timm entry points (the model name is the preset): it is refused with a clear
error, and the unknown-argument error no longer lists it. Before, create_model("revnet18", preset="revnet50") raised
'build_model_with_cfg() got multiple values for keyword argument 'preset'' while the unknown-argument message listed
preset as accepted."""

from __future__ import annotations

import pytest

timm = pytest.importorskip("timm")
import petra_hub.integrations.timm  # noqa: E402, F401 - registers the entry points


@pytest.mark.parametrize("name, other, model_class", [("revnet18", "revnet50", "TimmRevNet"),
                                                      ("revvit_tiny", "revvit-small", "TimmRevViT")])
def test_a_preset_argument_is_refused_clearly(name, other, model_class):
    with pytest.raises(TypeError, match=rf"^{model_class} got an unexpected keyword argument 'preset' \('{other}'\): "
                                        rf"the model name \('{name}'\) is the preset; expected no preset argument"):
        timm.create_model(name, preset=other)


def test_the_unknown_argument_error_does_not_list_preset():
    with pytest.raises(TypeError, match="unexpected keyword argument 'foo'; RevNet arguments are") as caught:
        timm.create_model("revnet18", foo=1, hidden_sizes=[8, 8, 8, 8], embedding_size=8)
    accepted = str(caught.value).split("arguments are ")[1]
    assert "preset" not in accepted and "stem" in accepted and "hidden_sizes" in accepted
