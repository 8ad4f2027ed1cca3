"""User text in a model card renders literally: class names, data set names, model names and the other strings a
user's data or arguments put into the body cannot add HTML, links, headings or code blocks, nor swallow the rest of
the card; the YAML header keeps them as they are."""

from __future__ import annotations

import re

import pytest
from huggingface_hub import ModelCard

from petra_hub.integrations.model_card import TrainingSummary, render_model_card, write_model_card
from petra_hub.integrations.model_card_text import code_span, markdown_text

markdown_it = pytest.importorskip("markdown_it")

HOSTILE_CLASSES = [
    "<script>alert(1)</script>",
    "[x](javascript:alert(1))",
    "# Owned",
    "```",
    "two\nlines\n## Injected",
    "![pixel](https://example.com/p.png)",
    "1. first",
    "---",
    "a | b",
    "~~~",
]
HOSTILE_DATASET = "evil ```\n# Owned data\n<img src=x onerror=alert(1)> [click](javascript:alert(1))"
HOSTILE_MODEL = "model\n# Owned model <b>bold</b>"
ORDINARY_CLASSES = ["airplane", "0", "9", "t-shirt/top", "sweet_pepper"]


def summary(**overrides) -> TrainingSummary:
    values = dict(model_name="revnet-plain", preset="revnet18", dataset="my-photos", dataset_id="org/photos",
                  eval_accuracy=0.5, label_names=["cat", "dog"], image_column="image", example_split="test",
                  framework_versions={"torch": "2.0"})
    values.update(overrides)
    return TrainingSummary(**values)


def hostile_summary(**overrides) -> TrainingSummary:
    values = dict(model_name=HOSTILE_MODEL, dataset=HOSTILE_DATASET, dataset_title=HOSTILE_DATASET,
                  label_names=HOSTILE_CLASSES, dataset_config="a`b | <c>", eval_split="test\n# Split",
                  hardware="<i>GPU</i> | x", base_model="../local `model`", extra={"<u>row</u>": "[v](javascript:x)"},
                  eval_metrics={"<em>f1</em>": 0.5}, example_split="te`st\n```",
                  results=[{"epoch": 1, "step": 2, "training_loss": 0.5, "eval_<s>x</s>": 0.25}])
    values.update(overrides)
    return summary(**values)


def parse(body: str):
    return markdown_it.MarkdownIt("commonmark").enable("table").parse(body)


def headings(body: str) -> list[str]:
    """The rendered headings: "h2 Training"."""
    tokens = parse(body)
    return [f"{token.tag} {rendered(tokens[i + 1])}" for i, token in enumerate(tokens) if token.type == "heading_open"]


def rendered(inline) -> str:
    """The text an inline token shows."""
    return "".join(child.content if child.type in ("text", "code_inline") else " " if child.type == "softbreak"
                   else "" for child in inline.children)


def fence_lines(body: str) -> list[str]:
    return [line for line in body.splitlines() if re.match(r" {0,3}(```|~~~)", line)]


def assert_body_is_the_templates(body: str, plain_body: str, model_name: str) -> None:
    """No raw HTML, no javascript link, the headings and code blocks of a card with plain names."""
    assert "<script" not in body and "<img" not in body and "<b>" not in body
    assert "](javascript:" not in body
    tokens = parse(body)
    kinds = {token.type for token in tokens} | {child.type for token in tokens for child in token.children or []}
    assert not kinds & {"html_block", "html_inline", "image"}, kinds
    links = [child.attrs.get("href") for token in tokens for child in token.children or []
             if child.type == "link_open"]
    assert all(str(href).startswith("https://") for href in links), links
    expected = headings(plain_body)
    expected[0] = f"h1 {model_name}"
    assert headings(body) == expected
    assert len(fence_lines(body)) % 2 == 0 and len(fence_lines(body)) == len(fence_lines(plain_body))
    assert [token.info for token in tokens if token.type == "fence"] == [
        token.info for token in parse(plain_body) if token.type == "fence"]


def table_cell(body: str, name: str) -> str:
    """The rendered value of the row `name` of a two-column table."""
    tokens = parse(body)
    for i, token in enumerate(tokens):
        if token.type == "inline" and rendered(token) == name and tokens[i + 2].type == "td_open":
            return rendered(tokens[i + 3])
    raise AssertionError(f"no row {name!r}")


def test_hostile_names_render_literally_in_the_body():
    plain = render_model_card(summary()).text
    card = render_model_card(hostile_summary(), repo_id='me/x"\n```\n# Owned repo')
    body = card.text
    assert_body_is_the_templates(body, plain, "model # Owned model <b>bold</b>")
    # the names are there, readable: rendered as given (line breaks folded into spaces)
    classes = table_cell(body, "Classes")
    assert classes == f"{len(HOSTILE_CLASSES)}: " + ", ".join(" ".join(n.split()) for n in HOSTILE_CLASSES)
    assert markdown_text(HOSTILE_CLASSES[0]) == r"&lt;script&gt;alert\(1\)&lt;/script&gt;"
    assert "| Classes | 10: " + ", ".join(markdown_text(n) for n in HOSTILE_CLASSES) + " |" in body
    dataset = " ".join(HOSTILE_DATASET.split())
    assert table_cell(body, "Data set") == f"{dataset} (org/photos, config a`b | <c>)"
    assert f"Trained on {markdown_text(HOSTILE_DATASET)} in mode" in body
    assert table_cell(body, "Hardware") == "<i>GPU</i> | x"
    assert table_cell(body, "<u>row</u>") == "[v](javascript:x)"
    assert table_cell(body, "Accuracy (test # Split)") == "50.00 %"
    assert table_cell(body, "<em>f1</em> (test # Split)") == "0.5"
    assert "fine-tuned from ../local `model`." in " ".join(rendered(t) for t in parse(body) if t.type == "inline")
    assert "| Eval &lt;s&gt;x&lt;/s&gt; |" in body
    # the snippets quote the repository and the split as Python strings, on one line
    assert 'from_pretrained("me/x\\"\\n```\\n# Owned repo")' in body
    assert 'split="te`st\\n```")[0]' in body


def test_the_yaml_header_keeps_hostile_names_as_they_are(tmp_path):
    hostile = hostile_summary(model_name="x\n---\nlicense: mit\n# Owned", dataset_title="t\n---\nfoo: [1")
    path = write_model_card(tmp_path, hostile)
    text = path.read_text()
    card = ModelCard.load(path)
    assert card.data.license == "apache-2.0" and "foo" not in card.data.to_dict()
    assert card.data.model_name == "x\n---\nlicense: mit\n# Owned"
    [result, *_] = card.data.eval_results
    assert result.dataset_name == "t\n---\nfoo: [1" and result.dataset_split == "test\n# Split"
    assert card.text.startswith(f"\n# {markdown_text(hostile.model_name)}\n") and card.text in text  # header ends
    assert_body_is_the_templates(card.text, render_model_card(summary()).text, "x --- license: mit # Owned")


def test_ordinary_names_stay_readable():
    card = render_model_card(summary(label_names=ORDINARY_CLASSES, dataset_title="CIFAR-10 (small)"))
    assert r"| Classes | 5: airplane, 0, 9, t-shirt/top, sweet\_pepper |" in card.text
    assert table_cell(card.text, "Classes") == "5: airplane, 0, 9, t-shirt/top, sweet_pepper"
    assert r"Trained on CIFAR-10 \(small\) in mode" in card.text
    assert "| Data set | CIFAR-10 \\(small\\) (`org/photos`) |" in card.text


def test_markdown_text_and_code_span():
    assert markdown_text("t-shirt/top") == "t-shirt/top" and markdown_text("0.5") == "0.5"
    assert markdown_text("sweet_pepper") == r"sweet\_pepper" and markdown_text("-0.5") == "-0.5"
    assert markdown_text("1. first") == r"1\. first" and markdown_text("- item") == r"\- item"
    assert markdown_text("a\r\nb\u2028c\td") == "a b c d"
    assert markdown_text("x & <y>") == "x &amp; &lt;y&gt;"
    assert code_span("uoft-cs/cifar10") == "`uoft-cs/cifar10`"
    assert code_span("a`b") == r"a\`b" and code_span("<b>") == "&lt;b&gt;"  # no span: escaped text


# ---------------------------------------------------------------------------------------------------------------
# the card a PetraTrainer writes for a `datasets` set with hostile class names


def test_a_trainers_card_escapes_the_datas_class_names_and_the_given_names(tmp_path):
    datasets = pytest.importorskip("datasets")
    from tests.training.test_card import hf_trainer, load_card, tensor_items

    names = ["<script>alert(1)</script>", "[x](javascript:alert(1))", "# Owned\n```"]
    features = datasets.Features({"pixel_values": datasets.Array3D((3, 16, 16), "float32"),
                                  "labels": datasets.ClassLabel(names=names)})
    train = datasets.Dataset.from_dict(tensor_items(8), features=features).with_format("torch")
    test = datasets.Dataset.from_dict(tensor_items(4, seed=1), features=features).with_format("torch")
    trainer = hf_trainer(tmp_path, train, {"<b>key</b>": test, "x`|y": test})
    trainer.create_model_card(dataset=HOSTILE_DATASET, model_name=HOSTILE_MODEL)
    body = load_card(tmp_path).text

    plain_trainer = hf_trainer(tmp_path / "plain", train, {"a": test, "b": test})
    plain_trainer.create_model_card(dataset="photos", model_name="plain")
    assert_body_is_the_templates(body, load_card(tmp_path / "plain").text, "model # Owned model <b>bold</b>")
    assert table_cell(body, "Classes") == "3: <script>alert(1)</script>, [x](javascript:alert(1)), # Owned ```"
    # the note naming the dict's other eval set quotes its key as text
    note = [rendered(t) for t in parse(body) if t.type == "inline" and "evaluated a dict" in t.content]
    assert note and "reports the first, <b>key</b>. The metrics of x`|y (named" in note[0]
