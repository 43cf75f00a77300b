"""Does a statement name its tenant? The check behind docs/citus.md.

On Citus, a table distributed by ``tenant_id`` is split into shards, and a
statement reaches one shard only when it pins ``tenant_id``: an equality (or
``IN``/``= ANY``) on it, ANDed into the statement's conditions. One that does
not fans out to every shard. :func:`unrouted` reads a statement with
PostgreSQL's own parser (pglast, libpg_query) and names each reference to a
per-tenant table that nothing pins; :func:`query_blocks` and
:func:`function_statements` find the statements the library sends, in its
query files (``<app>/queries.sql``) and in the SQL functions its migrations
create.

A statement that reads across tenants on purpose (retention, the delivery
read) says so in its reason, with a line starting ``Across tenants:``; the
check leaves it out, and docs/citus.md says what replaces each on Citus.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pglast
from pglast.parser import parse_plpgsql_json, parse_sql_json

#: The line of a block's reason that marks a statement that reads across tenants.
ACROSS_TENANTS = "Across tenants:"

_PLACEHOLDER = re.compile(r"%\(\w+\)s|%s|%%")
_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_PINNING = {"=", "IN", "ANY"}


def _numbered(sql: str) -> str:
    """psycopg's placeholders as PostgreSQL's ($1, $2...), a literal %% as %."""
    count = 0

    def replace(found: re.Match[str]) -> str:
        nonlocal count
        if found.group(0) == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(replace, sql)


def _walk(node: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every (node type, node) of a libpg_query JSON tree, outermost first."""
    if isinstance(node, dict):
        for kind, value in node.items():
            if isinstance(value, dict) and kind[:1].isupper():
                yield kind, value
                if kind == "SelectStmt":
                    # The arms of a UNION (INTERSECT, EXCEPT) are SelectStmts
                    # that the JSON does not name.
                    yield from (("SelectStmt", value[arm]) for arm in ("larg", "rarg")
                                if arm in value)
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _ranges(items: list[Any]) -> Iterator[tuple[dict[str, Any], list[Any]]]:
    """The tables of a FROM list (through joins, not into subqueries) and the joins' conditions."""
    for item in items:
        if "RangeVar" in item:
            yield item["RangeVar"], []
        elif "JoinExpr" in item:
            join = item["JoinExpr"]
            conditions = [join["quals"]] if "quals" in join else []
            for side in ("larg", "rarg"):
                for table, more in _ranges([join[side]]):
                    yield table, more + conditions


def _conjuncts(condition: Any) -> Iterator[dict[str, Any]]:
    """The conditions ANDed together in ``condition`` (an OR or NOT pins nothing)."""
    if not condition:
        return
    boolean = condition.get("BoolExpr")
    if boolean is not None:
        if boolean["boolop"] == "AND_EXPR":
            for arg in boolean["args"]:
                yield from _conjuncts(arg)
        return
    yield condition


def _is_tenant_column(node: Any, alias: str) -> bool:
    ref = node.get("ColumnRef") if isinstance(node, dict) else None
    if ref is None:
        return False
    names = [f.get("String", {}).get("sval") for f in ref["fields"]]
    return names == ["tenant_id"] or names == [alias, "tenant_id"]


def _pins(condition: dict[str, Any], alias: str) -> bool:
    expr = condition.get("A_Expr")
    if expr is not None:
        operator = expr["name"][0]["String"]["sval"] if expr.get("name") else ""
        kind = expr["kind"]
        if kind == "AEXPR_IN" or (kind == "AEXPR_OP_ANY" and operator == "=") or (
                kind == "AEXPR_OP" and operator == "="):
            return _is_tenant_column(expr.get("lexpr"), alias) or (
                kind == "AEXPR_OP" and _is_tenant_column(expr.get("rexpr"), alias))
        return False
    link = condition.get("SubLink")
    if link is not None and link["subLinkType"] == "ANY_SUBLINK":
        test = link.get("testexpr", {})
        columns = test["RowExpr"]["args"] if "RowExpr" in test else [test]
        return any(_is_tenant_column(c, alias) for c in columns)
    return False


def _problems(kind: str, stmt: dict[str, Any], tables: set[str]) -> Iterator[str]:
    if kind == "InsertStmt":
        table = stmt["relation"]["relname"]
        columns = [c["ResTarget"]["name"] for c in stmt.get("cols", [])]
        if table in tables and "tenant_id" not in columns:
            yield f"INSERT INTO {table} without a tenant_id column"
        return
    if kind == "SelectStmt":
        found = list(_ranges(stmt.get("fromClause", [])))
    elif kind == "UpdateStmt":
        found = [(stmt["relation"], [])] + list(_ranges(stmt.get("fromClause", [])))
    elif kind == "DeleteStmt":
        found = [(stmt["relation"], [])] + list(_ranges(stmt.get("usingClause", [])))
    else:
        return
    where = stmt.get("whereClause")
    for table, join_conditions in found:
        name = table["relname"]
        if name not in tables:
            continue
        alias = table.get("alias", {}).get("aliasname", name)
        conditions = [c for cond in [where, *join_conditions] for c in _conjuncts(cond)]
        if not any(_pins(c, alias) for c in conditions):
            shown = name if alias == name else f"{name} AS {alias}"
            yield f"{kind[:-4].upper()} on {shown} without a tenant_id condition"


def unrouted(sql: str, tables: set[str]) -> list[str]:
    """What in ``sql`` (one or more statements, psycopg placeholders allowed) would fan out.

    Each reference to one of ``tables`` (the per-tenant tables) in any
    SELECT, UPDATE, DELETE or INSERT of ``sql``, subqueries and CTEs included,
    that no ``tenant_id`` condition pins: an INSERT without a ``tenant_id``
    column, or a table whose query level has no ``tenant_id = ...``,
    ``tenant_id IN (...)`` or ``tenant_id = ANY (...)`` ANDed into its WHERE
    or join conditions.

    Raises:
        pglast.parser.ParseError: ``sql`` is not PostgreSQL (never passed silently).
    """
    tree = json.loads(parse_sql_json(_numbered(sql)))
    return [p for kind, node in _walk(tree) for p in _problems(kind, node, tables)]


def query_blocks(text: str) -> dict[str, tuple[str, str]]:
    """A query file's blocks (django_idempotency_outbox.sqlfiles), name -> (reason, statement)."""
    parts = _NAME.split(text)
    blocks: dict[str, tuple[str, str]] = {}
    for name, block in zip(parts[1::2], parts[2::2], strict=True):
        lines = block.strip().splitlines()
        reason = [line[2:].strip() for line in lines if line.startswith("--")]
        statement = "\n".join(line for line in lines if not line.startswith("--")).strip()
        blocks[name] = (" ".join(reason), statement.removesuffix(";"))
    return blocks


def _plpgsql_queries(tree: Any) -> Iterator[str]:
    for kind, node in _walk(tree):
        if kind != "PLpgSQL_expr":
            continue
        query = node["query"]
        mode = node.get("parseMode", 0)
        if mode >= 3:  # an assignment, "target := expression" (RAW_PARSE_PLPGSQL_ASSIGN1..3)
            query = "SELECT " + query.split(":=", 1)[1]
        elif mode != 0:  # an expression (RAW_PARSE_PLPGSQL_EXPR)
            query = "SELECT " + query
        yield query


def function_statements(sql: str) -> dict[str, list[str]]:
    """The statements inside each function a migration file creates (the last definition wins).

    ``sql`` is a migration's SQL file; ``LANGUAGE sql`` bodies are read as
    they are, PL/pgSQL bodies by PostgreSQL's PL/pgSQL parser (each statement
    and expression it embeds).
    """
    found: dict[str, list[str]] = {}
    for raw in pglast.parse_sql(sql):
        stmt = raw.stmt
        if type(stmt).__name__ != "CreateFunctionStmt":
            continue
        name = stmt.funcname[-1].sval
        options = {o.defname: o.arg for o in stmt.options}
        language = options["language"].sval
        body = options["as"][0].sval
        if language == "sql":
            found[name] = [body]
        elif language == "plpgsql":
            start = raw.stmt_location or 0
            text = sql[start:start + raw.stmt_len] if raw.stmt_len else sql[start:]
            found[name] = list(_plpgsql_queries(json.loads(parse_plpgsql_json(text))))
    return found
