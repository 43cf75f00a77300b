"""PostgreSQL's pgoutput protocol (version 1), decoded: what Debezium's connector reads.

The tests read a slot with ``pg_logical_slot_get_binary_changes(slot, NULL,
NULL, 'proto_version', '1', 'publication_names', pub)``: one row per message
of the protocol, in the order PostgreSQL decoded them (transactions in commit
order). Only what the tests need: Begin, Commit, Relation, Insert (text
columns), and the kinds that are skipped over whole (Origin, Type, Truncate,
Update, Delete, a logical message).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


@dataclass
class Transaction:
    xid: int
    commit_lsn: int = 0
    inserts: list[tuple[str, dict[str, str | None]]] = field(default_factory=list)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from("!" + fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str:
        end = self.data.index(b"\0", self.at)
        text = self.data[self.at:end].decode("utf-8")
        self.at = end + 1
        return text

    def raw(self, size: int) -> bytes:
        chunk = self.data[self.at:self.at + size]
        self.at += size
        return chunk


def decode(messages: list[bytes]) -> list[Transaction]:
    """The committed transactions of a slot's pgoutput messages, in decoding order."""
    relations: dict[int, tuple[str, list[str]]] = {}
    done: list[Transaction] = []
    current: Transaction | None = None
    for data in messages:
        r = _Reader(bytes(data))
        kind = chr(r.take("B"))
        if kind == "B":
            r.take("Q")  # the final LSN
            r.take("q")  # the commit time
            current = Transaction(xid=r.take("I"))
        elif kind == "C":
            assert current is not None, "a commit without its begin"
            r.take("B")
            current.commit_lsn = r.take("Q")
            done.append(current)
            current = None
        elif kind == "R":
            relid = r.take("I")
            namespace, name = r.string(), r.string()
            r.take("B")  # replica identity
            columns = []
            for _ in range(r.take("H")):
                r.take("B")
                columns.append(r.string())
                r.take("I")
                r.take("i")
            relations[relid] = (f"{namespace}.{name}", columns)
        elif kind == "I":
            assert current is not None, "an insert outside a transaction"
            table, columns = relations[r.take("I")]
            assert chr(r.take("B")) == "N"
            values: dict[str, str | None] = {}
            for column in columns[: r.take("H")]:
                part = chr(r.take("B"))
                if part == "n":
                    values[column] = None
                elif part == "t":
                    values[column] = r.raw(r.take("I")).decode("utf-8")
                else:  # 'u' (unchanged TOAST) never comes with an insert
                    raise AssertionError(f"unexpected column kind {part!r}")
            current.inserts.append((table, values))
        elif kind in "OYTUDM":
            continue
        else:
            raise AssertionError(f"unknown pgoutput message {kind!r}")
    return done
