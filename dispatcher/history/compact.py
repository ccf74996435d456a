"""A branch's in-memory history in compact form (the memory target: ≤ 2 KB per call retained).

:class:`CompactList` keeps its newest items as the objects they are (so a caller's own
ActionRequest stays the one in ``branch.messages``) and folds older ones, a block at a time,
into zlib-compressed JSON lines: a 100,000-call ``act()`` keeps a few hundred bytes per call
instead of its pydantic models. Reading an old item decodes its block (the last one decoded is
cached, so iterating costs one decode per block). The full records stay in Redis
(``Branch.load`` reads them back).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

__all__ = ["BLOCK_ITEMS", "LIVE_ITEMS", "CompactList"]

T = TypeVar("T")

# Items kept as objects at the end of the list; older ones are folded BLOCK_ITEMS at a time.
LIVE_ITEMS = 2048
BLOCK_ITEMS = 512


class CompactList(Sequence[T], Generic[T]):
    """An append-only list whose older items are stored compressed.

    ``encode(item) -> str`` must give one JSON line (no raw newline) that ``decode`` turns back
    into an equal item. Items may be appended with their encoding already made (the Redis
    write made it), so folding costs only the compression.
    """

    def __init__(
        self,
        encode: Callable[[T], str],
        decode: Callable[[str], T],
        *,
        live_items: int = LIVE_ITEMS,
        block_items: int = BLOCK_ITEMS,
    ) -> None:
        self._encode = encode
        self._decode = decode
        self._live_items = live_items
        self._block_items = block_items
        self._blocks: list[bytes] = []
        self._live: list[T] = []
        self._encoded: list[str | None] = []  # parallel to _live
        self._cached: tuple[int, list[T]] | None = None

    def append(self, item: T, encoded: str | None = None) -> None:
        self._live.append(item)
        self._encoded.append(encoded)
        self._fold()

    def extend(self, items: Iterable[T], encoded: Sequence[str] | None = None) -> None:
        new = list(items)
        self._live.extend(new)
        self._encoded.extend(encoded if encoded is not None else [None] * len(new))
        self._fold()

    def _fold(self) -> None:
        n = self._block_items
        while len(self._live) >= self._live_items + n:
            lines = [
                e if e is not None else self._encode(item)
                for item, e in zip(self._live[:n], self._encoded[:n], strict=True)
            ]
            self._blocks.append(zlib.compress("\n".join(lines).encode(), 1))
            del self._live[:n]
            del self._encoded[:n]

    def _block(self, index: int) -> list[T]:
        if self._cached is not None and self._cached[0] == index:
            return self._cached[1]
        text = zlib.decompress(self._blocks[index]).decode()
        items = [self._decode(line) for line in text.split("\n")]
        self._cached = (index, items)
        return items

    def lines(self, stop: int) -> list[str]:
        """The JSON lines of the first ``stop`` items, decompressed but not decoded (a
        broker that lost the history gets them written again: durable.DurableLog.restore)."""
        out: list[str] = []
        for block in self._blocks:
            if len(out) >= stop:
                break
            out.extend(zlib.decompress(block).decode().split("\n"))
        for item, encoded in zip(self._live, self._encoded, strict=True):
            if len(out) >= stop:
                break
            out.append(encoded if encoded is not None else self._encode(item))
        return out[:stop]

    def __len__(self) -> int:
        return len(self._blocks) * self._block_items + len(self._live)

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> list[T]: ...

    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError(f"history index {index} out of range (length {size})")
        folded = len(self._blocks) * self._block_items
        if index >= folded:
            return self._live[index - folded]
        block, offset = divmod(index, self._block_items)
        return self._block(block)[offset]

    def __iter__(self) -> Iterator[T]:
        for block in range(len(self._blocks)):
            yield from self._block(block)
        yield from list(self._live)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CompactList | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[Any]) -> list[Any]:
        return [*self, *other]

    def __repr__(self) -> str:
        return f"CompactList({len(self)} items, {len(self._blocks)} folded blocks)"
