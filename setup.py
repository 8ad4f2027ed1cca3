from setuptools import find_packages, setup

setup(
    name="petra_hub",
    version="0.1.0",
    description="PETRA: parallel end-to-end training of reversible networks across processes and devices",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    # The repository's model_cards/ folder ships inside the package as petra_hub.model_cards.
    package_dir={"": "src", "petra_hub.model_cards": "model_cards"},
    packages=find_packages("src") + ["petra_hub.model_cards"],
    package_data={"petra_hub.model_cards": ["*.md"]},
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.4",
        "torchvision>=0.19",  # timm needs it; also the paper's image transforms
        "transformers>=5.0,<6",
        "accelerate>=1.0",
        "datasets>=3.0",
        "timm>=1.0",
        "safetensors>=0.4",
        "huggingface-hub>=1.0",
        "scikit-learn>=1.3",
        "pyyaml",
        "pillow",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3", "matplotlib>=3.7", "tensorboard>=2.14", "ruff>=0.6"],
        "plots": ["matplotlib>=3.7"],
        "tensorboard": ["tensorboard>=2.14"],
    },
    entry_points={"console_scripts": ["petra-train=petra_hub.recipe:main"]},
)
