from typing import Any

def sub_blocks(
    values: Any, step: int, k: int, sums: Any, m2s: Any, mins: Any, maxs: Any, scratch: Any
) -> int: ...
