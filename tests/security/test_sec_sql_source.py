"""SQL is built only through SQLAlchemy: no SQL text assembled from strings, anywhere.

An AST walk over the shipped packages (not a regex: `form.text(…)` is not SQL)
finds every place raw SQL text enters a database call: SQLAlchemy's `text()`,
`literal_column()`, `exec_driver_sql()`, and DB-API `execute*()` called with a
string. Built strings (f-strings, `%`, `+`, `.format()`, variables) are
refused outright; constant SQL is allowed only where listed below, each with
its reason, so a new one is a review decision, not an accident.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("platform", "hydrant", "web", "engine", "kernels", "migrations")
SQL_CONSTRUCTS = {"text", "literal_column", "exec_driver_sql"}
DBAPI_CALLS = {"execute", "executemany", "executescript", "exec_driver_sql"}

# (file, the call as `ast.unparse` writes it): why it is fine.
ALLOWED_CONSTANT = {
    ("platform/db/session.py", "cursor.execute('PRAGMA foreign_keys=ON')"): "SQLite setup",
    ("platform/db/session.py", "cursor.execute('PRAGMA journal_mode=WAL')"): "SQLite setup",
    ("platform/db/session.py", "cursor.execute('PRAGMA busy_timeout=5000')"): "SQLite setup",
    ("platform/db/session.py", "text('SELECT 1')"): "the readiness ping",
    ("platform/reports/repository.py", "literal_column(\"'UTC'\")"): "a constant time zone",
    ("platform/reports/organization.py", "literal_column(\"'USD'\")"): (
        "a constant currency for entries with no price (a literal, so PostgreSQL can group by it)"
    ),
}
ALLOWED_BUILT = {
    # `unit` is a `Bucket` enum member and `_SQLITE_FORMATS` a module constant: a closed set,
    # inlined so PostgreSQL sees the SELECT and GROUP BY expressions as the same text.
    ("platform/reports/repository.py", "literal_column(f\"'{unit}'\")"),
    ("platform/reports/repository.py", "literal_column(f\"'{_SQLITE_FORMATS[unit]}'\")"),
}


@dataclass(frozen=True)
class SqlCall:
    path: str
    line: int
    source: str
    constant: bool


def _sqlalchemy_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound to SQLAlchemy's SQL constructs, and aliases of the sqlalchemy module."""
    names: set[str] = set()
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            names.update(a.asname or a.name for a in node.names if a.name in SQL_CONSTRUCTS)
        elif isinstance(node, ast.Import):
            modules.update(
                a.asname or a.name for a in node.names if a.name.startswith("sqlalchemy")
            )
    return names, modules


def _is_string_argument(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return _is_string_argument(node.left) or _is_string_argument(node.right)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
    )


def sql_calls(path: Path) -> list[SqlCall]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names, modules = _sqlalchemy_names(tree)
    relative = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    found: list[SqlCall] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func, argument = node.func, node.args[0]
        construct = (isinstance(func, ast.Name) and func.id in names) or (
            isinstance(func, ast.Attribute)
            and func.attr in SQL_CONSTRUCTS
            and isinstance(func.value, ast.Name)
            and func.value.id in modules
        )
        dbapi = (
            isinstance(func, ast.Attribute)
            and func.attr in DBAPI_CALLS
            and _is_string_argument(argument)
        )
        if construct or dbapi:
            constant = isinstance(argument, ast.Constant)
            found.append(SqlCall(relative, node.lineno, ast.unparse(node), constant))
    return found


def _shipped_files() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_no_sql_text_is_built_from_strings() -> None:
    built = [
        c
        for path in _shipped_files()
        for c in sql_calls(path)
        if not c.constant and (c.path, c.source) not in ALLOWED_BUILT
    ]
    assert not built, "\n".join(f"{c.path}:{c.line}: {c.source}" for c in built)


def test_constant_raw_sql_only_where_listed() -> None:
    unlisted = [
        c
        for path in _shipped_files()
        if "migrations" not in path.relative_to(ROOT).parts  # migrations: DDL is their job
        for c in sql_calls(path)
        if c.constant and (c.path, c.source) not in ALLOWED_CONSTANT
    ]
    assert not unlisted, "\n".join(f"{c.path}:{c.line}: {c.source}" for c in unlisted)


def test_the_scan_finds_what_it_must_refuse(tmp_path: Path) -> None:
    """The walk itself is tested: each pattern it exists for is caught."""
    sample = tmp_path / "sample.py"
    code = (
        "import sqlalchemy as sa\n"
        "from sqlalchemy import text as t\n"
        "def f(s, name, cursor):\n"
        "    s.execute(t(f'SELECT * FROM x WHERE n = {name}'))\n"
        "    s.execute(sa.text('SELECT %s' % name))\n"
        "    cursor.execute('SELECT ' + name)\n"
        "    cursor.execute('DELETE FROM x WHERE n = {}'.format(name))\n"
        "    s.exec_driver_sql(f'DROP TABLE {name}')\n"
        "    form.text(name)\n"
    )
    sample.write_text(code, encoding="utf-8")
    calls = sql_calls(sample)
    assert sorted(c.line for c in calls if not c.constant) == [4, 5, 6, 7, 8]
