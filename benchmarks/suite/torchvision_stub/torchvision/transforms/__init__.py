"""Only ``functional.to_tensor`` exists, and it refuses."""
