"""Run a Markdown page's snippets in a fresh project, as a reader following the page
would: ``startproject mysite .`` and ``startapp myapp`` on SQLite, file-named blocks
appended to their files, other Python blocks in ``manage.py shell -c``, the
``python manage.py`` commands of shell blocks in order, workers last (``--burst``),
then what the job tables hold. The rules, and the ``<!-- snippet: skip -->`` marker:
docs/architecture.md § The docs' links and snippets."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.markdown import Block, Page

ROOT = Path(__file__).resolve().parent.parent

FILE_HEADER = re.compile(r"^# (?P<path>[\w./-]+\.py)(?P<rest>\b.*)$")
SHELL = {"", "sh", "bash", "shell", "console"}
NOT_RUN = {"startproject", "startapp", "shell", "dbshell", "createsuperuser", "runserver"}
RUN_LAST = {"runworker", "runresetter"}
STUB = '#!/bin/sh\necho "(stub) $(basename "$0") $*" >&2\nexit 0\n'

DONE = """
import json
from django.apps import apps
from django.utils import timezone
from django_dbworker.models import WorkerJob

found = {}
for model in apps.get_models():
    if issubclass(model, WorkerJob):
        now = timezone.now()
        rows = model.objects.values_list("pk", "state", "process_after")
        found[model._meta.label] = {
            "completed": sum(state == "completed" for _, state, _ in rows),
            "unfinished": [
                f"{pk} {state}"
                for pk, state, after in rows
                if state not in ("completed", "canceled")
                and not (state == "queued" and after and after > now)
            ],
        }
print("JOBS=" + json.dumps(found))
"""


class SnippetError(AssertionError):
    pass


@dataclass
class Snippets:
    """A page's snippets run in ``root`` (an empty directory)."""

    root: Path
    timeout: float = 60.0
    log: list[str] = field(default_factory=list)
    last: list[list[str]] = field(default_factory=list)
    seen: set[tuple[str, ...]] = field(default_factory=set)
    models_changed: bool = False

    def __post_init__(self) -> None:
        stubs = self.root / ".stubs"
        stubs.mkdir(parents=True)
        for name in ("git", "make"):
            (stubs / name).write_text(STUB)
            (stubs / name).chmod(0o755)
        self.env = {
            key: value
            for key, value in os.environ.items()
            if key not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "PYTHONPATH")
            and not key.startswith("DBWORKER_")
        }
        self.env.update(
            PATH=f"{stubs}{os.pathsep}{os.environ.get('PATH', '')}",
            PYTHONPATH=str(ROOT),  # this checkout's django_dbworker
            PYTHONUNBUFFERED="1",
        )
        self.command([sys.executable, "-m", "django", "startproject", "mysite", "."], "setup")
        self.manage(["startapp", "myapp"], "setup")

    # -- running ------------------------------------------------------------------

    def command(self, args: list[str], where: str) -> str:
        started = time.monotonic()
        try:
            done = subprocess.run(
                args,
                cwd=self.root,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as exc:
            raise SnippetError(f"{where}: {shlex.join(args)} ran past {self.timeout}s") from exc
        took = f"{time.monotonic() - started:.1f}s"
        self.log.append(f"$ {shlex.join(args)}    ({where}, {took})\n{done.stdout}{done.stderr}")
        if done.returncode:
            raise SnippetError(
                f"{where}: {shlex.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done.stdout

    def manage(self, args: list[str], where: str) -> str:
        return self.command([sys.executable, "manage.py", *args], where)

    # -- a page ---------------------------------------------------------------------

    def run(self, page: Page) -> dict[str, dict[str, object]]:
        """Run ``page``'s snippets, then its workers; return what the job tables hold
        afterwards: per job model, its number of completed jobs and its unfinished ones
        (``"<pk> <state>"``)."""
        name = page.path.name
        for block in page.blocks():
            where = f"{name}:{block.line}"
            if block.marker == "skip":
                continue
            if block.marker is not None:
                raise SnippetError(f"{where}: unknown marker 'snippet: {block.marker}'")
            if block.info in ("python", "py"):
                self.python(block, where)
            elif block.info in SHELL:
                self.shell(block, where)
        if self.models_changed:  # as the page asks after a model change
            self.manage(["makemigrations"], f"{name}: models changed, before the workers")
            self.manage(["migrate"], f"{name}: models changed, before the workers")
        for args in self.last:
            self.manage(args, f"{name}: {args[0]}, run last")
        out = self.manage(["shell", "-c", DONE], f"{name}: the jobs afterwards")
        return json.loads(out.split("JOBS=", 1)[1])

    def python(self, block: Block, where: str) -> None:
        first = next((line for line in block.lines if line.strip()), "")
        if not FILE_HEADER.match(first):
            self.manage(["shell", "-c", block.text], where)
            return
        path, part = None, []
        for line in block.lines:
            header = FILE_HEADER.match(line)
            if header:
                if header["rest"].strip():
                    raise SnippetError(
                        f"{where}: {line!r} is a fragment: mark its block "
                        "<!-- snippet: skip --> or name the whole file"
                    )
                if path:
                    self.write(path, part, where)
                path, part = header["path"], []
            else:
                part.append(line)
        assert path
        self.write(path, part, where)

    def write(self, name: str, lines: list[str], where: str) -> None:
        source = "\n".join(lines).strip("\n") + "\n"
        if name == "settings.py":
            name = "mysite/settings.py"
            source = extend_settings(source, where)
        path = self.root / name
        self.models_changed |= path.name == "models.py"
        for parent in reversed(path.relative_to(self.root).parents):
            directory = self.root / parent
            if parent != Path(".") and not directory.exists():
                directory.mkdir()
                (directory / "__init__.py").touch()
        before = path.read_text() if path.exists() else ""
        path.write_text(f"{before.rstrip()}\n\n\n{source}" if before.strip() else source)

    def shell(self, block: Block, where: str) -> None:
        text = re.sub(r"\\\n", " ", block.text)
        for line in text.splitlines():
            line = line.strip().removeprefix("$ ")
            try:
                words = shlex.split(line, comments=True)
            except ValueError:
                continue  # not a command (a log line with a quote)
            commands: list[list[str]] = [[]]
            for word in words:
                if word == "&&":
                    commands.append([])
                else:
                    commands[-1].append(word)
            for args in commands:
                if args[:2] != ["python", "manage.py"] or len(args) < 3:
                    continue
                command, rest = args[2], args[3:]
                if command in NOT_RUN and not (command == "shell" and "-c" in rest):
                    continue
                if command in RUN_LAST:
                    self.run_last(command, rest)
                    continue
                self.manage([command, *rest], where)
                if command == "makemigrations":
                    self.models_changed = False

    def run_last(self, command: str, rest: list[str]) -> None:
        """Keep a worker command for the end: once per command and set of handlers (a
        second ``runworker`` of the same handlers, with other options, would find
        nothing left to run)."""
        key = (command, *sorted(word for word in rest if word[0] != "-" or word == "--tasks"))
        if key in self.seen:
            return
        self.seen.add(key)
        if command == "runworker":
            if "--burst" not in rest and "--until-done" not in rest:
                rest = [*rest, "--burst"]
            rest = [*rest, "--max-time", str(int(self.timeout / 2))]
        elif "--once" not in rest:
            rest = [*rest, "--once"]
        self.last.append([command, *rest])


def extend_settings(source: str, where: str) -> str:
    """``NAME = [..., items]`` → ``NAME = [*NAME, items]`` (lists and tuples): the
    setting's value, extended; any other ``...`` is not a runnable setting."""
    tree = ast.parse(source)
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not isinstance(target, ast.Name) or not isinstance(node.value, ast.List | ast.Tuple):
            continue
        node.value.elts = [
            ast.Starred(ast.Name(target.id, ast.Load()), ast.Load())
            if isinstance(elt, ast.Constant) and elt.value is Ellipsis
            else elt
            for elt in node.value.elts
        ]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value is Ellipsis:
            raise SnippetError(f"{where}: a settings part with '...' this runner cannot merge")
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n"
