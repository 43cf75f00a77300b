"""Request fingerprints: what makes two requests "the same request".

A fingerprint is the SHA-256 of the method, the path (with its query string,
sorted), the principal and the canonical JSON of the parsed body. Canonical
JSON sorts object keys and uses compact separators, so clients that format
the same document differently still match. Uploaded files contribute their
own SHA-256 digest, name and size, never their raw bytes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.core.files.uploadedfile import UploadedFile
from django.utils.datastructures import MultiValueDict

_CHUNK = 64 * 1024


def file_digest(upload: UploadedFile[bytes]) -> dict[str, Any]:
    """Digest of an uploaded file; leaves the file at position 0 for the handler."""
    digest = hashlib.sha256()
    upload.seek(0)
    for chunk in upload.chunks(_CHUNK):
        digest.update(chunk)
    upload.seek(0)
    return {"file": upload.name, "size": upload.size, "sha256": digest.hexdigest()}


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON for a parsed body (dicts, lists, form data, files).

    Object keys are sorted and separators compact; files count by their
    digest, ``Decimal`` and other non-JSON values by their ``str()``. The
    bytes are those of ``json.dumps(..., sort_keys=True, separators=(",",
    ":"), ensure_ascii=False)`` for every value ``json.dumps`` can encode, but
    the walk is iterative: no nesting depth raises ``RecursionError``, a string
    with a lone surrogate (``"\\ud800"`` in JSON) is encoded with
    ``surrogatepass`` instead of raising, and an integer too long for ``str()``
    is written in hexadecimal. Any value a JSON parser returns has a canonical
    form; whether the request is acceptable is decided elsewhere
    (:mod:`idempotency.inputs`).
    """
    out = bytearray()
    _write(value, out)
    return bytes(out)


def _write(value: Any, out: bytearray) -> None:
    # A stack of values still to write, in reverse order. Containers push their
    # closing bracket, then their members with the separators between them.
    stack: list[Any] = [value]
    push = stack.append
    while stack:
        item = stack.pop()
        cls = item.__class__
        if cls is _Raw:
            out += item.text
            continue
        if cls is str:  # the common cases first: ABC checks are slow
            out += _string(item)
            continue
        if cls is int:
            out += _integer(item)
            continue
        if isinstance(item, UploadedFile):
            item = file_digest(item)
        elif isinstance(item, bytes):
            item = {"sha256": hashlib.sha256(item).hexdigest()}
        elif isinstance(item, Decimal):
            item = str(item)
        if isinstance(item, str):
            out += _string(item)
        elif item is None:
            out += b"null"
        elif item is True:
            out += b"true"
        elif item is False:
            out += b"false"
        elif isinstance(item, int):
            out += _integer(item)
        elif isinstance(item, float):
            out += _float(item).encode()
        elif isinstance(item, MultiValueDict | Mapping):
            if isinstance(item, MultiValueDict):
                members = {str(k): item.getlist(k) for k in item}
            else:
                members = {str(k): v for k, v in item.items()}
            out += b"{"
            push(_Raw(b"}"))
            for index, name in enumerate(sorted(members, reverse=True)):
                if index:
                    push(_Raw(b","))
                push(members[name])
                push(_Raw(_string(name) + b":"))
        elif isinstance(item, list | tuple):
            out += b"["
            push(_Raw(b"]"))
            for index, member in enumerate(reversed(item)):
                if index:
                    push(_Raw(b","))
                push(member)
        else:  # what json.dumps(default=str) does
            out += _string(str(item))


class _Raw:
    """Bytes to copy as they are (brackets and separators on the stack)."""

    __slots__ = ("text",)

    def __init__(self, text: bytes) -> None:
        self.text = text


def _string(text: str) -> bytes:
    return encode_basestring(text).encode("utf-8", "surrogatepass")


def _integer(value: int) -> bytes:
    try:
        return int.__repr__(value).encode()
    except ValueError:  # more digits than sys.get_int_max_str_digits() allows
        return f"0x{int(value):x}".encode() if value >= 0 else f"-0x{-int(value):x}".encode()


def _float(value: float) -> str:
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == -float("inf"):
        return "-Infinity"
    return float.__repr__(value)


def canonical_path(path: str, query_string: str = "") -> str:
    if not query_string:
        return path
    pairs = sorted(parse_qsl(query_string, keep_blank_values=True))
    return f"{path}?{urlencode(pairs)}"


def principal_of(user: Any) -> str:
    """A stable name for the authenticated user, or ``"anonymous"``."""
    if user is None or not getattr(user, "is_authenticated", False):
        return "anonymous"
    meta = getattr(user, "_meta", None)
    label = meta.label_lower if meta is not None else type(user).__qualname__
    return f"{label}:{user.pk}"


def fingerprint(method: str, path: str, principal: str, body: Any) -> str:
    """SHA-256 hex digest identifying a request for key-reuse detection."""
    digest = hashlib.sha256()
    for part in (method.upper(), path, principal):
        digest.update(part.encode("utf-8"))
        digest.update(b"\x00")
    digest.update(canonical_json(body))
    return digest.hexdigest()
