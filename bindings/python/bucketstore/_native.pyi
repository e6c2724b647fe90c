# The extension module: the C library (reached through ctypes by _ffi) and the binding's C
# functions (_native.c documents each).
from typing import Any, Callable, List, Sequence, Tuple

def setup(op: type, chunk: type, op_types: Tuple[Any, ...],
          save_lookup: Callable[..., bytes], inval: type) -> None: ...
def bucket_data(storage: int, checkpoint: int, requests: Sequence[Tuple[bytes, int]],
                limit: int, chunk_bytes: int, max_bytes: int
                ) -> Tuple[int, bytes, Tuple[List[Any], bool]]: ...
def save_many(writer: int, saves: Sequence[Any]) -> Tuple[int, bytes, Tuple[int, int]]: ...
