"""Apply each claim-breaking edit of the catalogue and see whether its tests notice.

Usage (``make mutants`` runs it with PostgreSQL and Redis up)::

    python -m mutants.run                    every mutant
    python -m mutants.run consumer.offset-on-commit relay.xid-across-send
    python -m mutants.run --module outbox.relay
    python -m mutants.run --list             the catalogue, nothing run
    python -m mutants.run --check            only check that every snippet still matches
    python -m mutants.run --tree REV         the tests as they were at REV (git)

Each mutant's edits are made in a scratch copy of the working tree (never in
the clone itself), the mutant's tests are run there (``pytest -x``), and the
file is put back before the next mutant. A mutant is *killed* when its tests
fail, *survived* when they pass. Before any mutant is applied, every
snippet must occur exactly once in its file, or the run stops: a catalogue
that no longer matches the code would otherwise report mutants it never made.

The exit status is 1 when a mutant that breaks a documented claim survived
(one marked ``equivalent`` in the catalogue is reported, not counted), 2 when
the catalogue does not match the code or the unmutated tests fail.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import defaultdict
from io import BytesIO
from pathlib import Path

from mutants.catalogue import CATALOGUE, Mutant

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 300  # seconds per mutant's tests: a mutant that hangs them counts as killed
BASELINE_TIMEOUT = 3600  # seconds for the unmutated run of every mutant's tests


def scratch_tree(rev: str | None) -> Path:
    """A copy of the project (the working tree, or ``rev``'s) in a new temporary directory."""
    where = Path(tempfile.mkdtemp(prefix="dio-mutants-"))
    if rev is None:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, check=True, capture_output=True,
        ).stdout.decode().split("\0")
        for name in filter(None, listed):
            source = ROOT / name
            if source.is_file():
                target = where / name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    else:
        archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT,
                                 check=True, capture_output=True).stdout
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(where, filter="data")
        # The runner and its catalogue come from the working tree, whatever the tests' age.
        shutil.copytree(ROOT / "mutants", where / "mutants", dirs_exist_ok=True)
    if (ROOT / ".run").exists():  # the services' env file, should a test look for it
        os.symlink(ROOT / ".run", where / ".run")
    # Compiled once, as in the clone: processes the tests start (gunicorn workers
    # replacing killed ones) would otherwise compile every module as they boot,
    # and miss the timing the tests expect.
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-x", r"/\.run/", str(where)],
                   check=True, capture_output=True)
    return where


def mismatches(tree: Path, mutants: list[Mutant]) -> list[str]:
    problems = []
    for mutant in mutants:
        for edit in mutant.edits:
            path = tree / edit.file
            text = path.read_text() if path.exists() else ""
            found = text.count(edit.old)
            if found != 1:
                problems.append(f"{mutant.id}: {edit.file}: the snippet occurs {found} times "
                                f"(expected once): {edit.old.strip().splitlines()[0][:70]!r}")
    return problems


def existing_tests(tree: Path, tests: tuple[str, ...]) -> list[str]:
    return [t for t in tests if (tree / t.split("::")[0]).exists()]


def pytest(tree: Path, tests: list[str], log: Path, timeout: float = TIMEOUT) -> tuple[int, float]:
    started = time.monotonic()
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    with log.open("w") as out:
        # A session of its own: a run that times out is killed with everything it
        # started (a live server, a worker), which its fixtures can no longer stop.
        proc = subprocess.Popen(
            command, cwd=tree, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            # The scratch tree has no history; tests that need it read this checkout's.
            env={**os.environ, "DIO_REPOSITORY": str(ROOT)},
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -1
    return code, time.monotonic() - started


def write(path: Path, text: str) -> None:
    """Write a source file and drop its compiled copies, which could otherwise outlive it."""
    path.write_text(text)
    for compiled in (path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"):
        compiled.unlink()


def apply(tree: Path, mutant: Mutant) -> dict[Path, str]:
    originals: dict[Path, str] = {}
    for edit in mutant.edits:
        path = tree / edit.file
        originals.setdefault(path, path.read_text())
        write(path, path.read_text().replace(edit.old, edit.new, 1))
    return originals


def restore(originals: dict[Path, str]) -> None:
    for path, text in originals.items():
        write(path, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mutants.run",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("ids", nargs="*", help="mutant ids (default: all)")
    parser.add_argument("--module", action="append", default=[],
                        help="only this module's mutants")
    parser.add_argument("--list", action="store_true", help="list the catalogue and stop")
    parser.add_argument("--check", action="store_true", help="only check the snippets")
    parser.add_argument("--tree", metavar="REV", help="run the tests as they were at REV")
    parser.add_argument("--keep", action="store_true", help="keep the scratch tree and logs")
    args = parser.parse_args(argv)

    known = {m.id for m in CATALOGUE}
    unknown = [i for i in args.ids if i not in known]
    if unknown:
        print(f"mutants: unknown id(s) {', '.join(unknown)}; --list shows them", file=sys.stderr)
        return 2
    chosen = [m for m in CATALOGUE
              if (not args.ids or m.id in args.ids)
              and (not args.module or m.module in args.module)]
    if not chosen:
        print("mutants: nothing chosen", file=sys.stderr)
        return 2
    if args.list:
        for m in chosen:
            flag = " (equivalent)" if m.equivalent else ""
            print(f"{m.id:42} {m.module:22} {m.claim}{flag}")
        return 0

    tree = scratch_tree(args.tree)
    try:
        problems = mismatches(tree, chosen)
        if problems:
            print("mutants: the catalogue no longer matches the code; fix it first:",
                  file=sys.stderr)
            for problem in problems:
                print("  " + problem, file=sys.stderr)
            return 2
        if args.check:
            print(f"mutants: all {len(chosen)} mutants match the code")
            return 0
        logs = tree / ".mutant-logs"
        logs.mkdir()
        every_test = sorted({t for m in chosen for t in existing_tests(tree, m.tests)})
        print(f"mutants: the unmutated tests first ({len(every_test)} targets)", flush=True)
        # Every mutant's tests at once: as long as the whole suite may take.
        code, took = pytest(tree, every_test, logs / "baseline.log", timeout=BASELINE_TIMEOUT)
        if code != 0:
            print((logs / "baseline.log").read_text()[-3000:], file=sys.stderr)
            reason = (f"took longer than {BASELINE_TIMEOUT} s" if code == -1
                      else "fail without any mutant")
            print(f"mutants: the tests {reason}; nothing measured", file=sys.stderr)
            return 2
        print(f"mutants: baseline green in {took:.0f} s", flush=True)

        results: dict[str, list[tuple[Mutant, str]]] = defaultdict(list)
        for number, mutant in enumerate(chosen, 1):
            tests = existing_tests(tree, mutant.tests)
            if not tests:
                verdict, took = "survived", 0.0  # nothing left to notice it
            else:
                originals = apply(tree, mutant)
                try:
                    code, took = pytest(tree, tests, logs / f"{mutant.id}.log")
                finally:
                    restore(originals)
                verdict = "killed" if code != 0 else "survived"
            if verdict == "survived" and mutant.equivalent:
                verdict = "equivalent"
            results[mutant.module].append((mutant, verdict))
            print(f"[{number}/{len(chosen)}] {verdict:10} {mutant.id} ({took:.0f} s)",
                  flush=True)

        print()
        print(f"{'module':24} {'mutants':>7} {'killed':>6} {'survived':>8} {'equiv.':>6} "
              f"{'score':>6}")
        totals = [0, 0, 0, 0]
        for module in sorted(results):
            rows = results[module]
            counts = [len(rows), sum(v == "killed" for _, v in rows),
                      sum(v == "survived" for _, v in rows),
                      sum(v == "equivalent" for _, v in rows)]
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
            print(f"{module:24} {counts[0]:7} {counts[1]:6} {counts[2]:8} {counts[3]:6} "
                  f"{score(counts):>6}")
        print(f"{'all':24} {totals[0]:7} {totals[1]:6} {totals[2]:8} {totals[3]:6} "
              f"{score(totals):>6}")
        survivors = [(m, v) for rows in results.values() for m, v in rows if v != "killed"]
        for mutant, verdict in survivors:
            note = f": {mutant.equivalent}" if mutant.equivalent else f" ({mutant.claim})"
            print(f"  {verdict}: {mutant.id}{note}")
        return 1 if any(v == "survived" for _, v in survivors) else 0
    finally:
        if args.keep:
            print(f"mutants: scratch tree and logs kept in {tree}")
        else:
            shutil.rmtree(tree, ignore_errors=True)


def score(counts: list[int]) -> str:
    total, killed, _survived, equivalent = counts
    judged = total - equivalent
    return f"{100 * killed / judged:.0f}%" if judged else "-"


if __name__ == "__main__":
    sys.exit(main())
