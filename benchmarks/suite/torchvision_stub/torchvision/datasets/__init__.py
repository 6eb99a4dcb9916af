"""Names ``streaming.vision`` imports; the image datasets themselves are not available."""

from typing import Any

from torch.utils.data import Dataset


class VisionDataset(Dataset):  # type: ignore[type-arg]
    """Enough of torchvision's base class for a subclass to be defined and constructed."""

    def __init__(self, root: Any = None, transforms: Any = None, transform: Any = None,
                 target_transform: Any = None) -> None:
        self.root = root
        self.transforms = transforms
        self.transform = transform
        self.target_transform = target_transform


class CIFAR10(VisionDataset):
    """Not available in the stub."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError("torchvision stub: CIFAR10 is not available")
