"""t2t_lite: Tensor2Tensor-style Transformer training with exact gradient accumulation."""

from setuptools import find_packages, setup

setup(
    name="t2t_lite",
    version="0.1.0",
    description="T2T-style seq2seq Transformer training with exact MultistepAdam "
    "gradient accumulation on TensorFlow 2 / Keras 3.",
    # TensorFlow 2.21 and tensorflow-text 2.21 ship wheels for CPython 3.10-3.13 only
    # (every other pin below has releases for all four)
    python_requires=">=3.10,<3.14",
    classifiers=[
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    ],
    packages=find_packages(include=["t2t_lite", "t2t_lite.*"]),
    install_requires=[
        "tensorflow==2.21.*",
        # Keras 3.13 and later need Python 3.11; on 3.10 the newest is 3.12, which is
        # also the oldest that TensorFlow 2.21 accepts
        'keras==3.15.*; python_version >= "3.11"',
        'keras==3.12.*; python_version < "3.11"',
        "tensorboard==2.21.*",  # tf.summary needs it; TF 2.21 no longer pulls it in
        "absl-py==2.*",
        "numpy>=1.26,<3",
        "sentencepiece==0.2.*",  # subword vocabularies (t2t-datagen)
        "tensorflow-datasets==4.9.*",  # TFDS translation problems (read, never fetched)
        "sacrebleu==2.*",  # BLEU/chrF with standard signatures (t2t-bleu, BLEU during training)
        "tensorflow-text==2.21.*",  # SentencePiece ops inside t2t-exporter's SavedModels
        "matplotlib==3.10.*",  # t2t-plot's figures (Agg backend: no display needed)
    ],
    extras_require={
        # t2t-exporter --format=ctranslate2 and t2t-decoder --engine=ctranslate2: the
        # C++ inference engine most translation toolkits convert to; its converter
        # API fills a TransformerSpec, so we write no model format of our own
        "ctranslate2": ["ctranslate2==4.8.*"],
        "test": [
            "pytest==9.*",
            # two test processes: the suite is mostly single-threaded Python, tracing
            # and subprocess start-up, so -n 2 on 2 cores runs it in 0.67x the time
            "pytest-xdist==3.8.*",
            # scripts/bench_peers.py's Keras peer (tests/test_bench_peers.py runs it);
            # keras-hub 0.26 and later need Python 3.11: 0.25.1 is the newest on 3.10
            'keras-hub==0.32.0; python_version >= "3.11"',
            'keras-hub==0.25.1; python_version < "3.11"',
            # tensorflow-text is what keras-hub pulls in, pinned to our TF
            "tensorflow-text==2.21.*",
            "ctranslate2==4.8.*",  # tests/test_ctranslate2.py
            # .ci/lint: formatting, import order, unused code and branchiness in one
            # fast tool, configured in ruff.toml
            "ruff==0.17.*",
        ],
    },
    entry_points={
        "console_scripts": [
            "t2t-trainer=t2t_lite.bin.trainer:run",
            "t2t-datagen=t2t_lite.bin.datagen:run",
            "t2t-decoder=t2t_lite.bin.decoder:run",
            "t2t-avg-all=t2t_lite.bin.avg_checkpoints:run",
            "t2t-bleu=t2t_lite.bin.bleu:run",
            "t2t-exporter=t2t_lite.bin.exporter:run",
            "t2t-plot=t2t_lite.bin.plot:run",
        ],
    },
)
