"""Stub torchvision for the simstore benchmark's peer virtualenv only.

PyPI's torchvision 0.28.0 is a CUDA build: beside the CPU torch 2.13.0 its compiled
operators do not load, and its import fails (``operator torchvision::nms does not
exist``). ``import streaming`` (MosaicML Streaming) imports ``torchvision.datasets`` and
``torchvision.transforms.functional`` for its image datasets, and LitData imports
``torchvision.io`` only to decode images and video. The benchmark streams tensors, not
images, so this stub provides those names and fails loudly if an image path is used.
"""

__version__ = "0.28.0+simstore.stub"
