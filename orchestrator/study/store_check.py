"""The study's MLflow store checked before anything is written: a SQLite file (or its folder) that takes a
write now, a server that answers; file stores are refused."""

from __future__ import annotations

from pathlib import Path

from trainables.errors import UserInputError


def sqlite_write_problem(database: Path, timeout_s: float = 3.0) -> str | None:
    """Why an existing SQLite store cannot take a write, or None when it can. SQLite opens a file it
    may not write (read-only, immutable, on a read-only mount) read-only without a word, so taking its
    write lock proves nothing: a table is created and rolled back (the database file is unchanged;
    a hot journal a killed writer left is rolled back on the way, as any writer would)."""
    import sqlite3
    import uuid

    try:
        connection = sqlite3.connect(str(database), timeout=timeout_s, isolation_level=None)
    except sqlite3.Error as exc:
        return str(exc)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute(f"CREATE TABLE orchestrator_write_check_{uuid.uuid4().hex} (x)")
        connection.execute("ROLLBACK")
        return None
    except sqlite3.Error as exc:
        return str(exc)
    finally:
        connection.close()


def store_problem(uri: str) -> tuple[str, str] | None:
    """(why, fix) when the SQLite store at `uri` (absolute) cannot take a write now; None when it can,
    or when it is a server (whose answer `check_tracking_uri` checked)."""
    if not uri.startswith("sqlite:///"):
        return None
    from orchestrator.study.files import unwritable

    database = Path(uri.removeprefix("sqlite:///"))
    if database.is_dir():
        return "it is a folder", "give the path of a database file (sqlite:///path/to/mlflow.db)"
    if not database.exists():
        problem = unwritable(database.parent)
        return (problem, f"the folder {database.parent} cannot be created or written; make it writable or choose "
                         "another path") if problem else None
    problem = sqlite_write_problem(database)
    if problem is None:
        return None
    if "locked" in problem:
        return problem, "another process holds the store's write lock; close it, then try again"
    if "not a database" in problem:
        return problem, "point tracking.mlflow_uri at an MLflow store, or move that file away"
    return problem, (f"make {database.name} and its folder writable (chmod u+w; chattr -i for an immutable file), "
                     "or choose another tracking.mlflow_uri")


def check_tracking_uri(uri: str, base: Path) -> None:
    """SQLite needs a store (or a folder) that takes a write, a server must answer; file stores are
    refused (use SQLite)."""
    key = "tracking.mlflow_uri"
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        found = store_problem("sqlite:///" + str(path if path.is_absolute() else base / path))
        if found:
            raise UserInputError(key, uri, f"the store cannot be written now ({found[0]}); {found[1]}")
        return
    if uri.startswith(("http://", "https://")):
        import urllib.request

        try:
            with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5) as answer:
                answer.read()
        except OSError as exc:
            raise UserInputError(key, uri, f"the tracking server does not answer ({exc}); start it or fix the URL") \
                from None
        return
    raise UserInputError(key, uri, "use sqlite:///path/to/mlflow.db (the default) or an http(s):// tracking server")
