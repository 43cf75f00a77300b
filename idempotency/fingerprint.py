"""Request fingerprints: what makes two requests "the same request".

A fingerprint is the SHA-256 of the method, the path (with its query string,
sorted), the principal and the canonical JSON of the parsed body. Canonical
JSON sorts object keys and uses compact separators, so clients that format
the same document differently still match. Uploaded files contribute their
own SHA-256 digest, name and size, never their raw bytes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qsl, urlencode

from django.core.files.uploadedfile import UploadedFile
from django.utils.datastructures import MultiValueDict

_CHUNK = 64 * 1024


def file_digest(upload: UploadedFile) -> dict[str, Any]:
    """Digest of an uploaded file; leaves the file at position 0 for the handler."""
    digest = hashlib.sha256()
    upload.seek(0)
    for chunk in upload.chunks(_CHUNK):
        digest.update(chunk)
    upload.seek(0)
    return {"file": upload.name, "size": upload.size, "sha256": digest.hexdigest()}


def _canonical(value: Any) -> Any:
    if isinstance(value, UploadedFile):
        return file_digest(value)
    if isinstance(value, MultiValueDict):
        return {k: [_canonical(v) for v in value.getlist(k)] for k in value}
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    if isinstance(value, bytes):
        return {"sha256": hashlib.sha256(value).hexdigest()}
    if isinstance(value, Decimal):
        return str(value)
    return value


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON for a parsed body (dicts, lists, form data, files)."""
    return json.dumps(
        _canonical(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        default=str,
    ).encode("utf-8")


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
