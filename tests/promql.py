"""Just enough PromQL to evaluate the alert rules of docs/operations.md against scrapes
(tests/test_alerts.py): selectors with ``=``/``!=`` matchers, comparisons with a
number, ``/`` between vectors, ``and`` (``on (…)``), ``or``, ``sum [by (…)]``,
``increase``/``rate`` over a range and ``histogram_quantile``.

A range function sees the series in the first and the last scrape it is given: like
Prometheus, it has no value for a series that was not there at the first one (one
sample is not a rate). A rule fires when its expression gives any sample.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

#: A scrape: (seconds, {(name, ((label, value), …)): value}).
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Labels = frozenset[tuple[str, str]]
Vector = dict[Labels, float]

TOKEN = re.compile(
    r"\s*(?:(?P<number>\d+(?:\.\d+)?)|(?P<name>[a-zA-Z_:][\w:]*)|(?P<string>\"[^\"]*\")"
    r"|(?P<range>\[\d+[smh]\])|(?P<op>==|!=|>=|<=|[><(){},/=]))"
)
COMPARE = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}


@dataclass
class Scrapes:
    first: tuple[float, Samples]
    last: tuple[float, Samples]


def tokens(text: str) -> list[str]:
    found, position = [], 0
    text = text.strip()
    while position < len(text):
        match = TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise ValueError(f"cannot parse {text[position:]!r}")
        found.append(match.group().strip())
        position = match.end()
    return found


class Parser:
    def __init__(self, text: str, scrapes: Scrapes) -> None:
        self.tokens = tokens(text)
        self.at = 0
        self.scrapes = scrapes

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.tokens[self.at]
        if expected is not None and token != expected:
            raise ValueError(f"expected {expected!r}, got {token!r}")
        self.at += 1
        return token

    def labels(self) -> list[str]:
        self.take("(")
        names = []
        while self.peek() != ")":
            names.append(self.take())
            if self.peek() == ",":
                self.take(",")
        self.take(")")
        return names

    def parse(self) -> Vector:
        result = self.alternatives()
        if self.peek() is not None:
            raise ValueError(f"unexpected {self.peek()!r}")
        return result

    def infix(
        self, token: str, operand: Callable[[], Vector], combine: Callable[[Vector, Vector], Vector]
    ) -> Vector:
        """``operand (token operand)*``, combined from the left."""
        result = operand()
        while self.peek() == token:
            self.take()
            result = combine(result, operand())
        return result

    def alternatives(self) -> Vector:
        return self.infix("or", self.conjunction, lambda left, right: {**right, **left})

    def conjunction(self) -> Vector:
        result = self.comparison()
        while self.peek() == "and":
            self.take()
            on = None
            if self.peek() == "on":
                self.take()
                on = self.labels()
            other = self.comparison()
            if on is None:
                result = {k: v for k, v in result.items() if k in other}
            else:
                keys = {frozenset((n, v) for n, v in k if n in on) for k in other}
                result = {
                    k: v
                    for k, v in result.items()
                    if frozenset((n, x) for n, x in k if n in on) in keys
                }
        return result

    def comparison(self) -> Vector:
        result = self.quotient()
        if self.peek() in COMPARE:
            compare = COMPARE[self.take()]
            bound = float(self.take())
            result = {k: v for k, v in result.items() if compare(v, bound)}
        return result

    def quotient(self) -> Vector:
        return self.infix(
            "/",
            self.term,
            lambda left, right: {
                k: (v / right[k] if right[k] else math.nan) for k, v in left.items() if k in right
            },
        )

    def term(self) -> Vector:
        token = self.peek()
        if token == "(":
            self.take()
            result = self.alternatives()
            self.take(")")
            return result
        if token == "sum":
            self.take()
            by = []
            if self.peek() == "by":
                self.take()
                by = self.labels()
            self.take("(")
            inner = self.alternatives()
            self.take(")")
            summed: Vector = {}
            for key, value in inner.items():
                group = frozenset((n, v) for n, v in key if n in by)
                summed[group] = summed.get(group, 0.0) + value
            return summed
        if token in ("increase", "rate"):
            self.take()
            self.take("(")
            name, matchers = self.selector()
            self.take()  # the range: the scrapes given stand for it
            self.take(")")
            (t0, first), (t1, last) = self.scrapes.first, self.scrapes.last
            if t1 <= t0:
                return {}  # one sample is no range
            before = select(first, name, matchers)
            now = select(last, name, matchers)
            grown = {k: now[k] - before[k] for k in now if k in before}
            if token == "rate":
                grown = {k: v / (t1 - t0) for k, v in grown.items()}
            return grown
        if token == "histogram_quantile":
            self.take()
            self.take("(")
            quantile = float(self.take())
            self.take(",")
            buckets = self.alternatives()
            self.take(")")
            return histogram_quantile(quantile, buckets)
        name, matchers = self.selector()
        return select(self.scrapes.last[1], name, matchers)

    def selector(self) -> tuple[str, list[tuple[str, str, str]]]:
        name = self.take()
        matchers = []
        if self.peek() == "{":
            self.take()
            while self.peek() != "}":
                label, op, text = self.take(), self.take(), self.take()
                matchers.append((label, op, text.strip('"')))
                if self.peek() == ",":
                    self.take(",")
            self.take("}")
        return name, matchers


def select(samples: Samples, name: str, matchers: list[tuple[str, str, str]]) -> Vector:
    found: Vector = {}
    for (sample, labels), value in samples.items():
        if sample != name:
            continue
        given = dict(labels)
        if all((given.get(k, "") == v) == (op == "=") for k, op, v in matchers):
            found[frozenset(labels)] = value
    return found


def histogram_quantile(quantile: float, buckets: Vector) -> Vector:
    """Prometheus' estimate: linear within the bucket the rank falls in."""
    series: dict[Labels, list[tuple[float, float]]] = {}
    for key, count in buckets.items():
        labels = dict(key)
        bound = float(labels.pop("le"))
        series.setdefault(frozenset(labels.items()), []).append((bound, count))
    result: Vector = {}
    for key, points in series.items():
        points.sort()
        total = points[-1][1]
        if not total:
            continue
        rank = quantile * total
        lower_bound, lower_count = 0.0, 0.0
        for bound, count in points:
            if count >= rank:
                if math.isinf(bound):
                    result[key] = lower_bound
                else:
                    share = (
                        (rank - lower_count) / (count - lower_count) if count > lower_count else 0
                    )
                    result[key] = lower_bound + (bound - lower_bound) * share
                break
            lower_bound, lower_count = bound, count
    return result


def firing(expression: str, scrapes: Scrapes) -> Vector:
    """The samples ``expression`` gives (a rule fires when there is any)."""
    return Parser(expression, scrapes).parse()
