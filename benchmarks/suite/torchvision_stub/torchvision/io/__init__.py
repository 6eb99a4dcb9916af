"""No image or video codecs: LitData checks ``hasattr(torchvision.io, "read_video")``."""
