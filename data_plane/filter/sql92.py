"""SQL92 property filters (RocketMQ's ``MessageSelector.bySql`` / ``ExpressionType.SQL92``):
tokenizer → recursive-descent parser → a compiled predicate over a message's properties.

    text ──tokenize──▶ tokens ──_Parser──▶ closures ──SqlPredicate(properties)──▶ True / False

Grammar (keywords case-insensitive; what RocketMQ's filter module accepts, minus arithmetic)::

    condition  := and_expr ( OR and_expr )*
    and_expr   := not_expr ( AND not_expr )*
    not_expr   := NOT not_expr | primary
    primary    := '(' condition ')' | TRUE | FALSE
                | value ( cmp value | IS [NOT] NULL | [NOT] BETWEEN value AND value
                        | [NOT] IN '(' string ( ',' string )* ')' )
    cmp        := '=' | '<>' | '!=' | '<' | '>' | '<=' | '>='
    value      := property | 'string' | number | -number | TRUE | FALSE
    property   := [A-Za-z_$][A-Za-z0-9_$.]*        (a user property; TAGS and KEYS too)
    string     := '...' with '' for a quote
    number     := 123 | 1.5 | 1e3 | .5            (a trailing L, as in Java longs, is allowed)

Semantics (SQL's three-valued logic, as RocketMQ): a property a message does not carry is NULL;
any comparison, BETWEEN or IN with NULL is UNKNOWN; ``NOT UNKNOWN`` is UNKNOWN; AND / OR follow
Kleene's tables; a message is delivered only when the whole condition is TRUE. ``IS NULL`` is
TRUE for a missing property. Property values are strings: against a number (``a > 5``,
``a = 5``, BETWEEN) the value is parsed as a number, and a value that is not a number makes
the comparison UNKNOWN; against a string literal it compares as a string; against TRUE/FALSE
it must read ``true``/``false`` (any case). Ordering (<, >, <=, >=, BETWEEN) is numeric only:
a string literal there is refused when the expression is compiled.

Every mistake is a ``SqlParseError`` raised at compile time (subscribe time on the broker),
naming the 0-based character position; evaluation never raises.
"""

from __future__ import annotations

import collections
import re
import struct
from collections.abc import Callable
from typing import Final

from data_plane.store.message import decode_properties

EXPRESSION_TYPE_TAG: Final = "TAG"
EXPRESSION_TYPE_SQL92: Final = "SQL92"

MAX_EXPRESSION_CHARS: Final = 4096
MAX_DEPTH: Final = 64  # nested parentheses / NOTs
MAX_IN_ITEMS: Final = 1024

Props = dict[str, str]
Tri = bool | None  # TRUE, FALSE, UNKNOWN
Cond = Callable[[Props], Tri]
Val = Callable[[Props], "str | int | float | bool | None"]


class SqlParseError(ValueError):
    """An expression that cannot be compiled; ``position`` is the 0-based character offset."""

    def __init__(self, message: str, position: int, expression: str) -> None:
        self.position = position
        self.expression = expression
        super().__init__(f"SQL92 expression error at position {position}: {message}")


# --- tokens ----------------------------------------------------------------------------------
_KEYWORDS: Final = frozenset(("AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"))
_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[lL]?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<ident>[A-Za-z_$][A-Za-z0-9_$.]*)
  | (?P<op><>|!=|<=|>=|[=<>(),+-])
    """,
    re.VERBOSE,
)
_NUMBER_VALUE = re.compile(r"[+-]?(?:\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_INT_VALUE = re.compile(r"[+-]?\d+")


class _Tok:
    __slots__ = ("kind", "pos", "text", "value")

    def __init__(self, kind: str, text: str, pos: int, value: str | int | float | None = None) -> None:
        self.kind = kind  # ident | keyword | string | number | op | eof
        self.text = text
        self.pos = pos
        self.value = value

    def describe(self) -> str:
        return "the end of the expression" if self.kind == "eof" else repr(self.text)


def tokenize(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos, n = 0, len(text)
    while pos < n:
        m = _TOKEN.match(text, pos)
        if m is None:
            if text[pos] == "'":
                raise SqlParseError("unterminated string literal", pos, text)
            raise SqlParseError(f"unexpected character {text[pos]!r}", pos, text)
        kind = m.lastgroup or ""
        raw = m.group()
        if kind == "number":
            # "5abc": a number running into a name is no number at all
            end = m.end()
            if end < n and (text[end].isalnum() or text[end] in "_$"):
                raise SqlParseError(f"malformed number {raw + text[end]!r}", pos, text)
            out.append(_Tok("number", raw, pos, _number_literal(raw, pos, text)))
        elif kind == "string":
            out.append(_Tok("string", raw, pos, raw[1:-1].replace("''", "'")))
        elif kind == "ident":
            up = raw.upper()
            out.append(_Tok("keyword", up, pos) if up in _KEYWORDS else _Tok("ident", raw, pos, raw))
        elif kind == "op":
            out.append(_Tok("op", raw, pos))
        pos = m.end()
    out.append(_Tok("eof", "", n))
    return out


def _number_literal(raw: str, pos: int, text: str) -> int | float:
    s = raw.rstrip("lL")
    if s != raw and not _INT_VALUE.fullmatch(s):
        raise SqlParseError(f"malformed number {raw!r} (L follows whole numbers only)", pos, text)
    try:
        return int(s) if _INT_VALUE.fullmatch(s) else float(s)
    except (ValueError, OverflowError):
        raise SqlParseError(f"malformed number {raw!r}", pos, text) from None


def _as_number(v: str) -> int | float | None:
    """A property value read as a number (None when it is not one)."""
    s = v.strip()
    if _INT_VALUE.fullmatch(s):
        return int(s)
    if _NUMBER_VALUE.fullmatch(s):
        return float(s)
    return None


# --- values ----------------------------------------------------------------------------------
class _Value:
    """An operand: a property (read at evaluation) or a constant."""

    __slots__ = ("const", "kind", "name", "pos")

    def __init__(self, kind: str, pos: int, *, name: str = "", const: str | int | float | bool | None = None) -> None:
        self.kind = kind  # property | string | number | boolean
        self.pos = pos
        self.name = name
        self.const = const


_CMP: Final[dict[str, Callable[[int | float | str, int | float | str], bool]]] = {
    "=": lambda a, b: a == b,
    "<>": lambda a, b: a != b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,  # type: ignore[operator]
    ">": lambda a, b: a > b,  # type: ignore[operator]
    "<=": lambda a, b: a <= b,  # type: ignore[operator]
    ">=": lambda a, b: a >= b,  # type: ignore[operator]
}
_ORDERING: Final = frozenset(("<", ">", "<=", ">="))


def _coerce_pair(
    left: str | int | float | bool, right: str | int | float | bool, numeric_only: bool
) -> tuple[int | float | str, int | float | str] | None:
    """Both sides as comparable values of one kind (None: UNKNOWN)."""
    lb, rb = isinstance(left, bool), isinstance(right, bool)
    if lb or rb:
        if numeric_only:
            return None
        a = _as_bool(left)
        b = _as_bool(right)
        return None if a is None or b is None else (int(a), int(b))
    if isinstance(left, str) and isinstance(right, str) and not numeric_only:
        return left, right
    ln = _as_number(left) if isinstance(left, str) else left
    rn = _as_number(right) if isinstance(right, str) else right
    if ln is None or rn is None:
        return None
    return ln, rn


def _as_bool(v: str | int | float | bool) -> bool | None:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        low = v.strip().lower()
        if low == "true":
            return True
        if low == "false":
            return False
    return None


def _getter(v: _Value) -> Val:
    if v.kind == "property":
        name = v.name
        return lambda p: p.get(name)
    const = v.const
    return lambda p: const


# --- parser ----------------------------------------------------------------------------------
class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def error(self, message: str, tok: _Tok | None = None) -> SqlParseError:
        return SqlParseError(message, (tok or self.tok).pos, self.text)

    def take(self) -> _Tok:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def at_keyword(self, *words: str) -> bool:
        t = self.tok
        return t.kind == "keyword" and t.text in words

    def at_op(self, *ops: str) -> bool:
        t = self.tok
        return t.kind == "op" and t.text in ops

    def expect_keyword(self, word: str) -> None:
        if not self.at_keyword(word):
            raise self.error(f"expected {word}, found {self.tok.describe()}")
        self.take()

    def expect_op(self, op: str) -> None:
        if not self.at_op(op):
            raise self.error(f"expected {op!r}, found {self.tok.describe()}")
        self.take()

    def parse(self) -> Cond:
        if not self.text.strip():
            raise self.error("the expression is empty")
        cond = self.condition()
        if self.tok.kind != "eof":
            raise self.error(f"unexpected {self.tok.describe()} after a complete condition")
        return cond

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(f"the expression nests deeper than {MAX_DEPTH} levels")

    def condition(self) -> Cond:
        self._enter()
        parts = [self.and_expr()]
        while self.at_keyword("OR"):
            self.take()
            parts.append(self.and_expr())
        self.depth -= 1
        return parts[0] if len(parts) == 1 else _or(parts)

    def and_expr(self) -> Cond:
        parts = [self.not_expr()]
        while self.at_keyword("AND"):
            self.take()
            parts.append(self.not_expr())
        return parts[0] if len(parts) == 1 else _and(parts)

    def not_expr(self) -> Cond:
        if self.at_keyword("NOT"):
            self.take()
            self._enter()
            inner = self.not_expr()
            self.depth -= 1
            return _not(inner)
        return self.primary()

    def primary(self) -> Cond:
        t = self.tok
        if self.at_op("("):
            self.take()
            cond = self.condition()
            self.expect_op(")")
            return cond
        start = self.tok
        left = self.value()
        if left.kind == "boolean" and not self._at_predicate_operator():
            const = bool(left.const)
            return lambda p: const
        if self.at_op(*_CMP):
            op = self.take()
            right = self.value()
            return self.comparison(left, op, right)
        if self.at_keyword("IS"):
            self.take()
            negate = False
            if self.at_keyword("NOT"):
                self.take()
                negate = True
            self.expect_keyword("NULL")
            get = _getter(left)
            if negate:
                return lambda p: get(p) is not None
            return lambda p: get(p) is None
        negate = False
        if self.at_keyword("NOT"):
            self.take()
            negate = True
            if not self.at_keyword("BETWEEN", "IN"):
                raise self.error(f"expected BETWEEN or IN after NOT, found {self.tok.describe()}")
        if self.at_keyword("BETWEEN"):
            self.take()
            low = self.value()
            self.expect_keyword("AND")
            high = self.value()
            for v in (left, low, high):
                self._check_numeric(v, "BETWEEN")
            cond = _between(_getter(left), _getter(low), _getter(high))
            return _not(cond) if negate else cond
        if self.at_keyword("IN"):
            self.take()
            cond = self.in_list(left)
            return _not(cond) if negate else cond
        if t.kind in ("ident", "string", "number"):
            raise self.error(
                f"expected a comparison (=, <>, <, >, <=, >=, BETWEEN, IN, IS NULL) after {start.describe()}, "
                f"found {self.tok.describe()}"
            )
        raise self.error(f"expected a condition, found {start.describe()}", start)

    def _at_predicate_operator(self) -> bool:
        return self.at_op(*_CMP) or (self.at_keyword("IS", "BETWEEN", "IN", "NOT") and not self._not_starts_condition())

    def _not_starts_condition(self) -> bool:
        # "TRUE NOT ..." is never a predicate on TRUE unless BETWEEN/IN follows the NOT
        if not self.at_keyword("NOT"):
            return False
        nxt = self.toks[self.i + 1]
        return not (nxt.kind == "keyword" and nxt.text in ("BETWEEN", "IN"))

    def value(self) -> _Value:
        t = self.tok
        if t.kind == "ident":
            self.take()
            return _Value("property", t.pos, name=str(t.value))
        if t.kind == "string":
            self.take()
            return _Value("string", t.pos, const=t.value)
        if t.kind == "number":
            self.take()
            return _Value("number", t.pos, const=t.value)
        if t.kind == "op" and t.text in "+-":
            self.take()
            n = self.tok
            if n.kind != "number":
                raise self.error(f"expected a number after {t.text!r}, found {n.describe()}")
            self.take()
            num = n.value
            assert isinstance(num, int | float)
            return _Value("number", t.pos, const=-num if t.text == "-" else num)
        if t.kind == "keyword" and t.text in ("TRUE", "FALSE"):
            self.take()
            return _Value("boolean", t.pos, const=t.text == "TRUE")
        if t.kind == "keyword" and t.text == "NULL":
            raise self.error("NULL is not a value here: use IS NULL or IS NOT NULL")
        raise self.error(f"expected a property name, string or number, found {t.describe()}")

    def _check_numeric(self, v: _Value, what: str) -> None:
        if v.kind in ("string", "boolean"):
            shown = repr(v.const) if v.kind == "string" else str(v.const).upper()
            raise SqlParseError(f"{shown} cannot be compared with {what}: it needs a number", v.pos, self.text)

    def comparison(self, left: _Value, op: _Tok, right: _Value) -> Cond:
        ordering = op.text in _ORDERING
        if ordering:
            self._check_numeric(left, op.text)
            self._check_numeric(right, op.text)
        elif (left.kind == "boolean" and right.kind in ("string", "number")) or (
            right.kind == "boolean" and left.kind in ("string", "number")
        ):
            other = right.kind if left.kind == "boolean" else left.kind
            raise self.error(f"a boolean cannot be compared with a {other}", op)
        elif {left.kind, right.kind} == {"string", "number"}:
            raise self.error("a string cannot be compared with a number", op)
        cmp = _CMP[op.text]
        lg, rg = _getter(left), _getter(right)

        def compare(p: Props) -> Tri:
            a = lg(p)
            b = rg(p)
            if a is None or b is None:
                return None
            pair = _coerce_pair(a, b, ordering)
            if pair is None:
                return None
            return cmp(pair[0], pair[1])

        return compare

    def in_list(self, left: _Value) -> Cond:
        self.expect_op("(")
        items: list[str] = []
        while True:
            t = self.tok
            if t.kind != "string":
                raise self.error(f"IN takes string literals only, found {t.describe()}")
            self.take()
            items.append(str(t.value))
            if len(items) > MAX_IN_ITEMS:
                raise self.error(f"IN lists at most {MAX_IN_ITEMS} values", t)
            if self.at_op(","):
                self.take()
                continue
            self.expect_op(")")
            break
        values = frozenset(items)
        get = _getter(left)

        def contains(p: Props) -> Tri:
            v = get(p)
            if v is None:
                return None
            return (v if isinstance(v, str) else str(v)) in values

        return contains


def _and(parts: list[Cond]) -> Cond:
    def f(p: Props) -> Tri:
        unknown = False
        for c in parts:
            r = c(p)
            if r is False:
                return False
            if r is None:
                unknown = True
        return None if unknown else True

    return f


def _or(parts: list[Cond]) -> Cond:
    def f(p: Props) -> Tri:
        unknown = False
        for c in parts:
            r = c(p)
            if r is True:
                return True
            if r is None:
                unknown = True
        return None if unknown else False

    return f


def _not(c: Cond) -> Cond:
    def f(p: Props) -> Tri:
        r = c(p)
        return None if r is None else not r

    return f


def _between(get: Val, low: Val, high: Val) -> Cond:
    def f(p: Props) -> Tri:
        v, lo, hi = get(p), low(p), high(p)
        if v is None or lo is None or hi is None:
            return None
        a = _coerce_pair(v, lo, True)
        b = _coerce_pair(v, hi, True)
        if a is None or b is None:
            return None
        return a[1] <= a[0] and b[0] <= b[1]  # type: ignore[operator]

    return f


# --- compiled predicates ----------------------------------------------------------------------
class SqlPredicate:
    """A compiled expression: ``pred(properties)`` is True only when the condition is TRUE."""

    __slots__ = ("_cond", "expression")

    def __init__(self, expression: str, cond: Cond) -> None:
        self.expression = expression
        self._cond = cond

    def __call__(self, properties: Props) -> bool:
        return self._cond(properties) is True

    def evaluate(self, properties: Props) -> Tri:
        """The three-valued result (None = UNKNOWN)."""
        return self._cond(properties)

    def matches_record(self, record: memoryview) -> bool:
        """The predicate over a CommitLog record's properties (a store ``RecordFilter``)."""
        props = record_properties(record)
        return props is not None and self._cond(props) is True

    def __repr__(self) -> str:
        return f"SqlPredicate({self.expression!r})"


def compile_sql92(expression: str | None) -> SqlPredicate:
    """Compile ``expression``; raises SqlParseError (a ValueError) saying where and why."""
    text = expression if isinstance(expression, str) else ""
    if len(text) > MAX_EXPRESSION_CHARS:
        raise SqlParseError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters", 0, text[:64])
    return SqlPredicate(text, _Parser(text).parse())


def validate(expression: str | None) -> str | None:
    """Why ``expression`` cannot be compiled, or None when it can."""
    try:
        compile_sql92(expression)
    except SqlParseError as e:
        return str(e)
    return None


_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_BODY_LENGTH_AT = 84
_HEADER_BYTES = 88


def record_properties(record: memoryview) -> Props | None:
    """The properties of a CommitLog record (layout in data_plane/store/message.py), or None
    when the record's lengths do not nest (never a match)."""
    n = len(record)
    if n < _HEADER_BYTES + 3:
        return None
    (body_len,) = _INT.unpack_from(record, _BODY_LENGTH_AT)
    p = _HEADER_BYTES + body_len
    if body_len < 0 or p + 3 > n:
        return None
    p += 1 + record[p]
    if p + 2 > n:
        return None
    (props_len,) = _SHORT.unpack_from(record, p)
    p += 2
    if props_len < 0 or p + props_len > n:
        return None
    try:
        return decode_properties(record[p : p + props_len])
    except UnicodeDecodeError:
        return None


class PredicateCache:
    """Compiled predicates per (group, topic, expression), least recently used dropped first."""

    __slots__ = ("_entries", "max_entries")

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: collections.OrderedDict[tuple[str, str, str], SqlPredicate] = collections.OrderedDict()

    def get(self, group: str, topic: str, expression: str) -> SqlPredicate:
        """The compiled predicate (raises SqlParseError for a bad expression; not cached)."""
        key = (group, topic, expression)
        pred = self._entries.get(key)
        if pred is not None:
            self._entries.move_to_end(key)
            return pred
        pred = compile_sql92(expression)
        self._entries[key] = pred
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        return pred

    def __len__(self) -> int:
        return len(self._entries)
