"""``to_tensor`` for images is not available in the stub."""

from typing import Any


def to_tensor(pic: Any) -> Any:
    """Refuse: the benchmark reads tensors, never images."""
    raise NotImplementedError("torchvision stub: to_tensor (image decoding) is not available")
