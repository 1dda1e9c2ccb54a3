"""Finding duplicate chats: exact (same normalised text) and near (MinHash LSH over word shingles).

Both keep the first occurrence in source order, so which copy survives is deterministic.
"""

from __future__ import annotations

import hashlib
import re

from datasketch import MinHash, MinHashLSH

from .formats import Chat

NUM_PERM = 128
SHINGLE_WORDS = 3
WORD = re.compile(r"\w+")


def normalised_text(chat: Chat) -> str:
    """Role-tagged text with case and whitespace folded: copies that differ only in those are duplicates."""
    turns = [f"{t['role']}: {' '.join(t['content'].casefold().split())}" for t in chat["messages"]]
    return "\n".join(turns + [chat["tools"] or ""])


def exact_key(chat: Chat) -> str:
    return hashlib.sha256(normalised_text(chat).encode()).hexdigest()


def shingles(text: str) -> set[bytes]:
    words = WORD.findall(text)
    if len(words) < SHINGLE_WORDS:
        return {" ".join(words).encode()}
    return {" ".join(words[i : i + SHINGLE_WORDS]).encode() for i in range(len(words) - SHINGLE_WORDS + 1)}


class NearDuplicates:
    """Remembers kept chats; `seen` says whether a chat is near one of them (and remembers it if not)."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.lsh = MinHashLSH(threshold=threshold, num_perm=NUM_PERM)
        self.kept: list[MinHash] = []

    def seen(self, chat: Chat) -> bool:
        signature = MinHash(num_perm=NUM_PERM)
        signature.update_batch(list(shingles(normalised_text(chat))))
        # LSH returns candidates by band collisions; the signature estimate confirms them.
        if any(signature.jaccard(self.kept[int(key)]) >= self.threshold for key in self.lsh.query(signature)):
            return True
        self.lsh.insert(str(len(self.kept)), signature)
        self.kept.append(signature)
        return False
