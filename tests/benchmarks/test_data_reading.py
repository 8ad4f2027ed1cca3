"""benchmarks/data_reading.py: the data sets it makes are what the built-in readers load."""

from petra_hub.data import load_image_dataset

from .conftest import load


def test_the_made_sets_load_through_the_built_in_readers(tmp_path):
    bench = load("data_reading")
    (tmp_path / "npz").mkdir()
    imagenet32 = load_image_dataset("imagenet32", "train", data_dir=str(bench.make_imagenet32(tmp_path / "npz", 25)))
    assert len(imagenet32) == 25 and imagenet32[24]["pixel_values"].shape == (3, 32, 32)
    assert 0 <= int(imagenet32.labels.min()) and int(imagenet32.labels.max()) < 1000
    pngs = load_image_dataset("imagenet", "train", data_dir=str(bench.make_pngs(tmp_path / "png", 12, classes=3)))
    assert len(pngs) == 12 and pngs.info.num_labels == 3 and sorted(set(pngs.labels.tolist())) == [0, 1, 2]


def test_the_summary_takes_medians_over_repeats_and_pairs_the_ratios_by_repeat():
    bench = load("data_reading")

    def run(way, repeat, images_per_s, data_cpu_s):
        ranks = [{"rank": rank, "data_cpu_s": data_cpu_s + rank, "cpu_s": 1.0, "data_set_mib": 2.0,
                  "peak_rss_mib": 3.0, "reads_images": rank == 0, "reads_labels": rank == 1} for rank in range(2)]
        return {"data": "imagenet32", "way": way, "repeat": repeat, "ranks": ranks, "images_per_s": images_per_s}

    rows = [run("every-process", 0, 100.0, 1.0), run("every-process", 1, 200.0, 5.0),
            run("every-process", 2, 50.0, 3.0), run("only-what-it-needs", 0, 110.0, 0.0),
            run("only-what-it-needs", 1, 300.0, 0.0), run("only-what-it-needs", 2, 60.0, 0.0)]
    every, only = bench.summarize(rows)
    assert (every["way"], every["repeats"], every["images_per_s"]) == ("every-process", 3, 100.0)
    assert [rank["data_cpu_s"] for rank in every["ranks"]] == [3.0, 4.0]
    assert only["images_per_s"] == 110.0 and only["images_per_s_ratio"] == 1.2  # median of 1.1, 1.5, 1.2
    assert [rank["reads_images"] for rank in only["ranks"]] == [True, False]
