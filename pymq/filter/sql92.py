"""RocketMQ 4.9.4's SQL92 message selector: parser, checks and compiler to a Python closure.

``compile_sql92(text)`` parses an expression once and returns a :class:`Sql92Filter` whose
``matches(get)`` answers for one message, ``get(name)`` being the message's property lookup (its
user properties and system ones such as ``TAGS``; the broker passes a lookup over the record's
properties text).  Nothing is interpreted per message: every node becomes a closure, specialised
at compile time by the static type of its operands.

A hand-written lexer and recursive-descent parser mirror the JavaCC grammar of RocketMQ's
``SelectorParser.jj`` production by production, so that what Java accepts is accepted, what it
refuses is refused with the same words (``Sql92Error.remark`` is the text the Java broker puts in
its CHECK_CLIENT_CONFIG answer), and trailing tokens after a complete expression are ignored as
Java's parser ignores them (it never asks for ``<EOF>``).

The language (4.9.4 has no string predicates such as CONTAINS or STARTSWITH):

* literals: ``'string'`` (``''`` is a quote), integers (``5``, ``5L``; int when in 32-bit range,
  long otherwise), decimals (``1.5``, ``.5``, ``1e3``), ``TRUE``, ``FALSE``, ``NULL``;
  identifiers ``[A-Za-z_$][A-Za-z0-9_$]*`` are property names; keywords are case-insensitive;
* ``=``, ``<>``, ``>``, ``>=``, ``<``, ``<=``, ``[NOT] BETWEEN x AND y``, ``[NOT] IN ('a', ...)``,
  ``IS [NOT] NULL``, ``AND``, ``OR``, ``NOT``, unary ``+`` and ``-``, parentheses, ``--`` line
  and ``/* */`` block comments.

Evaluation follows Java's expression classes: property values are strings, converted to the
type of the literal they are compared with (``Integer.valueOf``, ``Long.valueOf``,
``Double.valueOf``, ``Boolean.valueOf``); two properties compare as doubles under ``<``/``>``; a
missing property makes a comparison unknown (``None``), which AND/OR/NOT carry as SQL's
three-valued logic; a conversion that fails aborts the evaluation and the message does not match.
"""

from __future__ import annotations

import decimal
import math
import re
import struct
from collections.abc import Callable
from typing import Any

__all__ = [
    "Sql92Error",
    "Sql92Filter",
    "compile_sql92",
    "java_double_str",
]

Getter = Callable[[str], "str | None"]
Fn = Callable[[Getter], Any]

# -- tokens (kinds as SelectorParserConstants numbers them) -------------------------------------

EOF, NOT, AND, OR, BETWEEN, IN, TRUE, FALSE, NULL, IS = 0, 8, 9, 10, 11, 12, 13, 14, 15, 16
DECIMAL, FLOAT, STRING, ID = 17, 18, 20, 21
EQ, NE, GT, GE, LT, LE, LPAREN, COMMA, RPAREN, PLUS, MINUS = range(22, 33)

TOKEN_IMAGE = (
    "<EOF>", '" "', '"\\t"', '"\\n"', '"\\r"', '"\\f"', "<LINE_COMMENT>", "<BLOCK_COMMENT>",
    '"NOT"', '"AND"', '"OR"', '"BETWEEN"', '"IN"', '"TRUE"', '"FALSE"', '"NULL"', '"IS"',
    "<DECIMAL_LITERAL>", "<FLOATING_POINT_LITERAL>", "<EXPONENT>", "<STRING_LITERAL>", "<ID>",
    '"="', '"<>"', '">"', '">="', '"<"', '"<="', '"("', '","', '")"', '"+"', '"-"',
)  # fmt: skip

_KEYWORDS = {
    "NOT": NOT, "AND": AND, "OR": OR, "BETWEEN": BETWEEN, "IN": IN, "TRUE": TRUE,
    "FALSE": FALSE, "NULL": NULL, "IS": IS,
}  # fmt: skip
_OPERATORS = {
    "<>": NE, ">=": GE, "<=": LE, "=": EQ, ">": GT, "<": LT, "(": LPAREN, ",": COMMA,
    ")": RPAREN, "+": PLUS, "-": MINUS,
}  # fmt: skip

# The parser's choice points (JavaCC's jj_la1 masks): the tokens each one would have taken.
_LA1: tuple[frozenset[int], ...] = (
    frozenset({OR}),
    frozenset({AND}),
    frozenset({IS, EQ, NE}),
    frozenset({EQ, NE}),
    frozenset({IS}),
    frozenset({NOT, BETWEEN, IN, GT, GE, LT, LE}),
    frozenset({COMMA}),
    frozenset({COMMA}),
    frozenset({BETWEEN, GT, GE, LT, LE}),
    frozenset({IN}),
    frozenset({NOT, TRUE, FALSE, NULL, DECIMAL, FLOAT, STRING, ID, LPAREN, MINUS}),
    frozenset({TRUE, FALSE, NULL, DECIMAL, FLOAT, STRING, ID, LPAREN}),
    frozenset({TRUE, FALSE, NULL, DECIMAL, FLOAT, STRING}),
)
_LITERALS = frozenset({TRUE, FALSE, NULL, DECIMAL, FLOAT, STRING})

_WHITESPACE = " \t\n\r\f"
_ID_RE = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_FLOAT_RE = re.compile(
    r"[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+"
)
_DECIMAL_RE = re.compile(r"0|[1-9][0-9]*[lL]?")
_STRING_RE = re.compile(r"'(?:''|[^'])*'")
_LINE_COMMENT_RE = re.compile(r"--[^\n\r]*(?:\r\n|\n|\r)")
_BLOCK_COMMENT_RE = re.compile(r"/\*[^*]*\*+(?:[^*/][^*]*\*+)*/")
_TAB_SIZE = 8

MAX_EXPRESSION_LENGTH = 64 * 1024
"""Longest expression compiled (characters); longer ones are refused as a parse failure."""
MAX_NESTING = 64
"""Deepest nesting of sub-expressions (parentheses, NOT, comparisons of comparisons; a chain of
ANDs or ORs counts once); deeper expressions are refused, so neither compiling nor evaluating can
exhaust Python's stack."""

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1
DOUBLE_MIN_VALUE = 5e-324


class Sql92Error(Exception):
    """An expression RocketMQ refuses; ``remark`` is Java's exception text for it."""

    def __init__(self, remark: str) -> None:
        super().__init__(remark)
        self.remark = remark


class _EvalError(Exception):
    """Raised while evaluating: Java's evaluator threw, the message does not match."""


class _NumberFormat(Exception):
    pass


class _ClassCast(Exception):
    pass


# -- Java value helpers -------------------------------------------------------------------------


def _escape(text: str) -> str:
    """JavaCC's add_escapes."""
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if code == 0:
            continue
        special = {
            "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r", '"': '\\"',
            "'": "\\'", "\\": "\\\\",
        }.get(ch)  # fmt: skip
        if special is not None:
            out.append(special)
        elif code < 0x20 or code > 0x7E:
            for unit in _utf16_units(ch):
                out.append(f"\\u{unit:04x}")
        else:
            out.append(ch)
    return "".join(out)


def _utf16_units(ch: str) -> list[int]:
    raw = ch.encode("utf-16-be", "surrogatepass")
    return [int.from_bytes(raw[i : i + 2], "big") for i in range(0, len(raw), 2)]


def java_double_str(value: float) -> str:
    """Java's ``Double.toString`` (with the shortest round-trip digits)."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign = "-" if value < 0 else ""
    _, digit_tuple, exponent = decimal.Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    # The value is 0.<digits> x 10^point.
    point = len(digit_tuple) + exponent
    if 1e-3 <= abs(value) < 1e7:
        if point <= 0:
            return f"{sign}0.{'0' * -point}{digits}"
        whole = digits[:point].ljust(point, "0")
        return f"{sign}{whole}.{digits[point:] or '0'}"
    return f"{sign}{digits[0]}.{digits[1:] or '0'}E{point - 1}"


def _java_str(value: Any) -> str:
    """Java's ``String.valueOf`` of a selector value (for %s in messages)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, float):
        return java_double_str(value)
    return str(value)


def _encode_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


_INT_TEXT = re.compile(r"[+-]?[0-9]+")
_DOUBLE_TEXT = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)
_HEX_DOUBLE_TEXT = re.compile(
    r"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?"
)


LONG_DIGITS = 19
"""The most significant digits a Java long has: a longer decimal is out of range, and is refused
before Python converts it (its int() refuses more than 4,300 digits, and is quadratic)."""


SHOWN_LITERAL_CHARS = 64
"""A literal quoted in an error remark is cut to this many characters."""


def _shown(text: str) -> str:
    return text if len(text) <= SHOWN_LITERAL_CHARS else text[:SHOWN_LITERAL_CHARS] + "..."


def _too_long(digits: str) -> bool:
    return len(digits.lstrip("+-").lstrip("0")) > LONG_DIGITS


def _parse_int(text: str, low: int, high: int) -> int:
    """``Integer.valueOf`` / ``Long.valueOf``."""
    if _INT_TEXT.fullmatch(text) is None or _too_long(text):
        raise _NumberFormat(f'For input string: "{_shown(text)}"')
    number = int(text)
    if number < low or number > high:
        raise _NumberFormat(f'For input string: "{text}"')
    return number


def _parse_java_int(text: str) -> int:
    return _parse_int(text, INT_MIN, INT_MAX)


def _parse_java_long(text: str) -> int:
    return _parse_int(text, LONG_MIN, LONG_MAX)


def _parse_java_double(text: str) -> float:
    """``Double.valueOf``: Java's literal forms (with an f/d suffix, NaN, Infinity, hex)."""
    trimmed = text.strip("".join(chr(c) for c in range(33)))
    if not trimmed:
        raise _NumberFormat("empty String")
    if _DOUBLE_TEXT.fullmatch(trimmed) is not None:
        if trimmed[-1] in "fFdD" and trimmed[-2:] != "NaN":
            trimmed = trimmed[:-1]
        if trimmed.lstrip("+-") == "NaN":
            return math.nan
        if trimmed.lstrip("+-") == "Infinity":
            return -math.inf if trimmed[0] == "-" else math.inf
        return float(trimmed)
    hexed = _HEX_DOUBLE_TEXT.fullmatch(trimmed)
    if hexed is not None:
        number = float.fromhex("0x" + hexed.group(2))
        return -number if hexed.group(1) == "-" else number
    raise _NumberFormat(f'For input string: "{trimmed}"')


def _parse_java_bool(text: str) -> bool:
    return text.lower() == "true"


_DOUBLE_BITS = struct.Struct(">q")
_NAN_BITS = 0x7FF8000000000000


def _double_bits(value: float) -> int:
    if value != value:
        return _NAN_BITS
    return _DOUBLE_BITS.unpack(struct.pack(">d", value))[0]


def _double_compare(a: float, b: float) -> int:
    """Java's ``Double.compare``: NaN above everything, -0.0 below 0.0."""
    if a < b:
        return -1
    if a > b:
        return 1
    x, y = _double_bits(a), _double_bits(b)
    return (x > y) - (x < y)


def _string_compare(a: str, b: str) -> int:
    """Java's ``String.compareTo`` sign (UTF-16 code-unit order)."""
    if a == b:
        return 0
    x = a.encode("utf-16-be", "surrogatepass")
    y = b.encode("utf-16-be", "surrogatepass")
    return -1 if x < y else 1


def _int_compare(a: int, b: int) -> int:
    return (a > b) - (a < b)


# Static types of selector values: S string (a property), INT int, L long, D double, B boolean,
# N always null.  Every expression's type is known when it is compiled, which is what lets each
# comparison be compiled to one specialised closure.
S, INT, L, D, B, N = "S", "I", "L", "D", "B", "N"
_NUMERIC = (INT, L, D)
_STRING_CONVERTERS: dict[str, Callable[[str], Any]] = {
    INT: _parse_java_int,
    L: _parse_java_long,
    D: _parse_java_double,
    B: _parse_java_bool,
}
_SAME_COMPARE: dict[str, Callable[[Any, Any], int]] = {
    S: _string_compare,
    INT: _int_compare,
    L: _int_compare,
    D: _double_compare,
    B: _int_compare,
}


def _incomparable(lv: Any, rv: Any) -> int:
    return -1


def _class_cast(lv: Any, rv: Any) -> int:
    raise _ClassCast(
        "class java.lang.Boolean cannot be cast to class java.lang.String (java.lang.Boolean "
        "and java.lang.String are in module java.base of loader 'bootstrap')"
    )


def _compare_fn(lt: str, rt: str) -> Callable[[Any, Any], int]:
    """Java's ``ComparisonExpression.__compare`` for operands of static types lt and rt (string
    conversions on, as the parser sets them): a function of the two non-null values."""
    if lt == rt:
        return _SAME_COMPARE.get(lt, _incomparable)
    if lt in (INT, L) and rt in (INT, L):
        return _int_compare
    if lt in (INT, L) and rt == D:
        return lambda lv, rv: _double_compare(float(lv), rv)
    if lt == D and rt in (INT, L):
        return lambda lv, rv: _double_compare(lv, float(rv))
    if lt in _NUMERIC and rt == S:
        convert = _STRING_CONVERTERS[lt]
        same = _SAME_COMPARE[lt]
        return lambda lv, rv: same(lv, convert(rv))
    if lt == S and rt in _STRING_CONVERTERS:
        convert = _STRING_CONVERTERS[rt]
        same = _SAME_COMPARE[rt]
        return lambda lv, rv: same(convert(lv), rv)
    if lt == B and rt == S:
        return _class_cast
    return _incomparable


# -- expression nodes (compile time only) -------------------------------------------------------


class _Node:
    """An expression while compiling: what Java's checks look at (constant? boolean? property?),
    its Java ``toString``, its static type and its closure."""

    __slots__ = ("_text", "depth", "fn", "is_bool", "jtype", "kind", "name", "terms", "value")

    def __init__(
        self,
        kind: str,
        jtype: str,
        text: str | Callable[[], str],
        fn: Fn,
        *,
        is_bool: bool = False,
        value: Any = None,
        name: str = "",
        children: tuple[_Node, ...] = (),
    ) -> None:
        self.depth: int = 1 + max((c.depth for c in children), default=0)
        if self.depth > MAX_NESTING:
            raise _too_deep()
        # The operands of a flattened AND or OR chain (with the operator), else empty.
        self.terms: tuple[str, list[_Node]] | tuple[()] = ()
        self.kind = kind  # "const", "prop" or "expr"
        self.jtype = jtype
        self._text = text
        self.fn = fn
        self.is_bool = is_bool
        self.value = value
        self.name = name

    @property
    def text(self) -> str:
        """Java's toString of the expression (built when a message needs it)."""
        if callable(self._text):
            self._text = self._text()
        return self._text


def _const(value: Any, jtype: str, *, is_bool: bool = False) -> _Node:
    if value is None:
        text = "NULL"
    elif value is True:
        text = "TRUE"
    elif value is False:
        text = "FALSE"
    elif isinstance(value, str):
        text = _encode_string(value)
    elif isinstance(value, float):
        text = java_double_str(value)
    else:
        text = str(value)
    return _Node("const", jtype, text, lambda get: value, is_bool=is_bool, value=value)


def _prop(name: str) -> _Node:
    return _Node("prop", S, name, lambda get: get(name), name=name)


def _too_deep() -> Sql92Error:
    return Sql92Error(
        f"java.lang.RuntimeException: expression nested deeper than {MAX_NESTING} levels "
        "(pymq's limit)"
    )


def _runtime(message: str) -> Sql92Error:
    return Sql92Error(f"java.lang.RuntimeException: {message}")


def _check_less_than_operand(node: _Node) -> None:
    if node.kind == "const":
        if node.jtype in _NUMERIC:
            return
        raise _runtime(f"Value '{node.text}' cannot be compared.")
    if node.is_bool:
        raise _runtime(f"Value '{node.text}' cannot be compared.")


def _check_equal_operand(node: _Node) -> None:
    if node.kind == "const" and node.value is None:
        raise _runtime(f"'{node.text}' cannot be compared.")


def _equal(left: _Node, right: _Node, symbol: str = "==") -> _Node:
    """Java's doCreateEqual: null-aware equality (a null on one side only: null if the left is
    null, false otherwise)."""

    def text() -> str:
        return f"({left.text} {symbol} {right.text})"

    if right.kind == "const" and right.value is None:  # IS NULL
        return _is_null(left, text)
    compare = _compare_fn(left.jtype, right.jtype)
    if left.kind == "prop" and right.value is not None:
        return _prop_equal_const(left, right, compare, text)
    lf, rf = left.fn, right.fn
    same_strings = left.jtype == S and right.jtype == S

    def equal(get: Getter) -> Any:
        lv = lf(get)
        rv = rf(get)
        if lv is None:
            return True if rv is None else None
        if rv is None:
            return False
        if same_strings:
            return lv == rv
        try:
            return compare(lv, rv) == 0
        except (_NumberFormat, _ClassCast) as exc:
            raise _EvalError(str(exc)) from None

    return _Node("expr", B, text, equal, is_bool=True, children=(left, right))


def _is_null(left: _Node, text: Callable[[], str]) -> _Node:
    """``left IS NULL`` (:func:`_equal` with a NULL constant on the right)."""
    if left.kind == "prop":
        name = left.name

        def is_null_prop(get: Getter) -> Any:
            return get(name) is None

        return _Node("expr", B, text, is_null_prop, is_bool=True)
    lf = left.fn
    return _Node("expr", B, text, lambda get: lf(get) is None, is_bool=True, children=(left,))


def _prop_equal_const(
    left: _Node, right: _Node, compare: Callable[[Any, Any], int], text: Callable[[], str]
) -> _Node:
    """``property = constant`` (:func:`_equal`'s common case): the property read by name, the
    constant bound once; a string constant compares without conversion."""
    name, constant = left.name, right.value
    if right.jtype == S:

        def prop_eq_str(get: Getter) -> Any:
            lv = get(name)
            return None if lv is None else lv == constant

        return _Node("expr", B, text, prop_eq_str, is_bool=True, children=(left,))

    def prop_eq_const(get: Getter) -> Any:
        lv = get(name)
        if lv is None:
            return None
        try:
            return compare(lv, constant) == 0
        except (_NumberFormat, _ClassCast) as exc:
            raise _EvalError(str(exc)) from None

    return _Node("expr", B, text, prop_eq_const, is_bool=True, children=(left,))


_ORDER_TESTS: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0,
    ">=": lambda c: c >= 0,
    "<": lambda c: c < 0,
    "<=": lambda c: c <= 0,
}


def _strings_as_doubles(lv: Any, rv: Any) -> int:
    """Two strings under ``<``, ``>``...: Java parses both as doubles or gives up."""
    try:
        return _double_compare(_parse_java_double(lv), _parse_java_double(rv))
    except _NumberFormat:
        raise _EvalError(
            f"It's illegal to compare string by '>=', '>', '<', '<='. lv={lv}, rv={rv}"
        ) from None


_INT_TESTS: dict[str, Callable[[int, int], bool]] = {
    ">": int.__gt__,
    ">=": int.__ge__,
    "<": int.__lt__,
    "<=": int.__le__,
}


def _order(left: _Node, right: _Node, symbol: str) -> _Node:
    """``>``, ``>=``, ``<``, ``<=``: two strings compare as doubles, otherwise as __compare."""
    _check_less_than_operand(left)
    _check_less_than_operand(right)

    def text() -> str:
        return f"({left.text} {symbol} {right.text})"

    test = _ORDER_TESTS[symbol]
    lf, rf = left.fn, right.fn
    compare: Callable[[Any, Any], int] = _strings_as_doubles
    if left.jtype != S or right.jtype != S:
        compare = _compare_fn(left.jtype, right.jtype)
    if left.kind == "prop" and right.jtype in _NUMERIC:
        # The common case, ``a > 5``: one lookup, one conversion, one comparison (numbers come
        # only from literals, so the right side's value is known now).
        name, constant = left.name, right.value
        if right.jtype == D:

            def prop_vs_double(get: Getter) -> Any:
                lv = get(name)
                if lv is None:
                    return None
                try:
                    number = _parse_java_double(lv)
                except _NumberFormat as exc:
                    raise _EvalError(str(exc)) from None
                return test(_double_compare(number, constant))

            return _Node("expr", B, text, prop_vs_double, is_bool=True, children=(left,))
        convert = _parse_java_int if right.jtype == INT else _parse_java_long
        op = _INT_TESTS[symbol]

        def prop_vs_int(get: Getter) -> Any:
            lv = get(name)
            if lv is None:
                return None
            try:
                return op(convert(lv), constant)
            except _NumberFormat as exc:
                raise _EvalError(str(exc)) from None

        return _Node("expr", B, text, prop_vs_int, is_bool=True, children=(left,))

    def ordered(get: Getter) -> Any:
        lv = lf(get)
        if lv is None:
            return None
        rv = rf(get)
        if rv is None:
            return None
        try:
            return test(compare(lv, rv))
        except (_NumberFormat, _ClassCast) as exc:
            raise _EvalError(str(exc)) from None

    return _Node("expr", B, text, ordered, is_bool=True, children=(left, right))


def _chain(op: str, left: _Node, right: _Node) -> _Node:
    return _chain_all(op, [left, right])


def _chain_all(op: str, operands: list[_Node]) -> _Node:
    """``operands[0] op operands[1] op ...``, a chain of them flattened into one closure (same
    order, same short-circuit and three-valued result as Java's left-deep LogicExpressions).
    Built once for a whole run of AND or OR: a node per operator made compiling a long chain
    take time in the square of its length."""
    symbol = "&&" if op == "AND" else "||"
    first = operands[0]
    terms = (first.terms[1] if first.terms and first.terms[0] == op else [first]) + operands[1:]

    def text() -> str:
        out = terms[0].text
        for term in terms[1:]:
            out = f"({out} {symbol} {term.text})"
        return out

    fns = tuple(t.fn for t in terms)
    decisive = op == "OR"  # the value that ends the chain: True for OR, False for AND

    def chain(get: Getter) -> Any:
        unknown = False
        for fn in fns:
            value = fn(get)
            if value is decisive:
                return decisive
            if value is None:
                unknown = True
        return None if unknown else not decisive

    node = _Node("expr", B, text, chain, is_bool=True, children=tuple(terms))
    node.terms = (op, terms)
    return node


def _and(left: _Node, right: _Node) -> _Node:
    return _chain("AND", left, right)


def _or(left: _Node, right: _Node) -> _Node:
    return _chain("OR", left, right)


def _not(node: _Node) -> _Node:
    f = node.fn

    def negated(get: Getter) -> Any:
        value = f(get)
        if value is None:
            return None
        return not value

    return _Node("expr", B, lambda: f"(NOT {node.text})", negated, is_bool=True, children=(node,))


def _boolean_cast(node: _Node) -> _Node:
    # Only a property is cast, and a property's value is a string: never TRUE.
    name = node.name

    def cast(get: Getter) -> Any:
        return None if get(name) is None else False

    return _Node("expr", B, node.text, cast, is_bool=True, children=(node,))


def _negate(node: _Node) -> _Node:
    def text() -> str:
        return f"(- {node.text})"

    if node.jtype in _NUMERIC:
        # Numbers come only from literals: the negation is folded now (it is still not a
        # ConstantExpression for Java's checks).
        value = -node.value
        return _Node("expr", node.jtype, text, lambda get: value, value=value, children=(node,))
    # Java negates only numbers; a property's string (or a boolean) gives null.
    return _Node("expr", N, text, lambda get: None, children=(node,))


def _in(left: _Node, values: list[str], negate: bool) -> _Node:
    if left.kind != "prop":
        raise _runtime(f"Expected a property for In expression, got: {left.text}")
    name = left.name
    members = frozenset(values)
    symbol = "NOT IN" if negate else "IN"
    text = f"{left.text} {symbol} ( {', '.join(values)} )"

    def contained(get: Getter) -> Any:
        value = get(name)
        if value is None:
            return None
        return (value in members) is not negate

    return _Node("expr", B, text, contained, is_bool=True, children=(left,))


def _between(value: _Node, low: _Node, high: _Node, negate: bool) -> _Node:
    if negate:
        return _or(_order(value, low, "<"), _order(value, high, ">"))
    if low.kind == "const" and high.kind == "const":
        lv, rv = low.value, high.value
        if lv is None or rv is None:
            raise _runtime("Illegal values of between, values can not be null!")
        try:
            ret = _compare_fn(high.jtype, low.jtype)(rv, lv)
        except _NumberFormat as exc:
            raise _runtime(f"java.lang.NumberFormatException: {exc}") from None
        except _ClassCast as exc:
            raise Sql92Error(f"java.lang.ClassCastException: {exc}") from None
        if ret < 0:
            raise _runtime(
                f"Illegal values of between, left value({_java_str(lv)}) must less than or "
                f"equal to right value({_java_str(rv)})"
            )
    return _and(_order(value, low, ">="), _order(value, high, "<="))


# -- lexer ----------------------------------------------------------------------------------------


class _Token:
    __slots__ = ("column", "image", "kind", "line")

    def __init__(self, kind: int, image: str, line: int, column: int) -> None:
        self.kind = kind
        self.image = image
        self.line = line
        self.column = column


def _positions(text: str) -> list[tuple[int, int]]:
    """(line, column) of each character as JavaCC's SimpleCharStream counts them."""
    out: list[tuple[int, int]] = []
    line, column = 1, 0
    prev_lf = prev_cr = False
    for ch in text:
        column += 1
        if prev_lf:
            prev_lf = False
            column = 1
            line += 1
        elif prev_cr:
            prev_cr = False
            if ch == "\n":
                prev_lf = True
            else:
                column = 1
                line += 1
        if ch == "\r":
            prev_cr = True
        elif ch == "\n":
            prev_lf = True
        elif ch == "\t":
            column -= 1
            column += _TAB_SIZE - (column % _TAB_SIZE)
        out.append((line, column))
    return out


class _Lexer:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.where = _positions(text)

    def _at(self, index: int) -> tuple[int, int]:
        if 0 <= index < len(self.where):
            return self.where[index]
        return (0, 0)

    def _lexical_error(self, start: int, last: int) -> Sql92Error:
        """TokenMgrError: the token starting at ``start`` died at index ``last`` (the last
        character JavaCC's automaton read); when nothing follows it, Java reports <EOF>."""
        text = self.text
        line, column = self._at(last)
        if last >= len(text) - 1:
            if text and text[last] in "\n\r":
                line, column = line + 1, 0
            else:
                column += 1
            after = text[start : last + 1] if last > start else ""
            encountered = "<EOF> "
        else:
            ch = text[last]
            after = text[start:last]
            encountered = f'"{_escape(ch)}" ({ord(ch)}), '
        message = (
            f"Lexical error at line {line}, column {column}.  Encountered: {encountered}"
            f'after : "{_escape(after)}"'
        )
        return Sql92Error(f"org.apache.rocketmq.filter.parser.TokenMgrError: {message}")

    def _skip_blanks(self, pos: int) -> int:
        """The index of the first character from ``pos`` on that is neither whitespace nor in a
        comment (a ``--`` comment needs its line end: without one it is two minus signs)."""
        text, n = self.text, len(self.text)
        while True:
            while pos < n and text[pos] in _WHITESPACE:
                pos += 1
            if text.startswith("--", pos):
                m = _LINE_COMMENT_RE.match(text, pos)
                if m is not None:
                    pos = m.end()
                    continue
            if text.startswith("/*", pos):
                m = _BLOCK_COMMENT_RE.match(text, pos)
                if m is None:
                    raise self._lexical_error(pos, n - 1)
                pos = m.end()
                continue
            return pos

    def _number(self, pos: int) -> tuple[int, int]:
        """The kind and end of the numeric literal at ``pos`` (a digit or a "."): JavaCC's
        longest match, a FLOAT over a DECIMAL only when it is longer."""
        text = self.text
        fm = _FLOAT_RE.match(text, pos)
        dm = _DECIMAL_RE.match(text, pos)
        f_end = fm.end() if fm else -1
        d_end = dm.end() if dm else -1
        if f_end < 0 and d_end < 0:  # a "." without digits
            raise self._lexical_error(pos, min(pos + 1, len(text) - 1))
        return (FLOAT, f_end) if f_end > d_end else (DECIMAL, d_end)

    def next_token(self) -> _Token:
        text, n = self.text, len(self.text)
        pos = self._skip_blanks(self.pos)
        if pos >= n:
            self.pos = n
            line, column = self._at(n - 1) if n else (0, 0)
            return _Token(EOF, "", line, column)
        line, column = self.where[pos]
        ch = text[pos]
        kind: int
        end: int
        if ch == "'":
            m = _STRING_RE.match(text, pos)
            if m is None:
                raise self._lexical_error(pos, n - 1)
            kind, end = STRING, m.end()
        elif ch.isascii() and (ch.isalpha() or ch in "_$"):
            m = _ID_RE.match(text, pos)
            assert m is not None
            end = m.end()
            kind = _KEYWORDS.get(text[pos:end].upper(), ID)
        elif ch.isascii() and (ch.isdigit() or ch == "."):
            kind, end = self._number(pos)
        elif text.startswith(("<>", ">=", "<="), pos):
            kind, end = _OPERATORS[text[pos : pos + 2]], pos + 2
        elif ch in _OPERATORS:
            kind, end = _OPERATORS[ch], pos + 1
        elif ch == "/":  # not a comment
            raise self._lexical_error(pos, min(pos + 1, n - 1))
        else:
            raise self._lexical_error(pos, pos)
        self.pos = end
        return _Token(kind, text[pos:end], line, column)


# -- parser ---------------------------------------------------------------------------------------


class _Parser:
    """Recursive descent over SelectorParser.jj's productions, with JavaCC's bookkeeping for
    error messages: a generation counter bumped per consumed token, and the choice points that
    gave up at the current generation (their tokens are what the message says was expected)."""

    def __init__(self, text: str) -> None:
        self.lexer = _Lexer(text)
        self.tokens: list[_Token] = []
        self.index = 0  # the next token to consume
        self.gen = 0
        self.la1 = [-1] * len(_LA1)
        self.depth = 0

    def peek(self, ahead: int = 0) -> _Token:
        while len(self.tokens) <= self.index + ahead:
            if self.tokens and self.tokens[-1].kind == EOF:
                return self.tokens[-1]
            self.tokens.append(self.lexer.next_token())
        return self.tokens[self.index + ahead]

    def ntk(self) -> int:
        return self.peek().kind

    def consume(self, kind: int) -> _Token:
        token = self.peek()
        if token.kind == kind:
            self.index += 1
            self.gen += 1
            return token
        raise self.parse_error(kind)

    def parse_error(self, kind: int = -1) -> Sql92Error:
        expected = set()
        if kind >= 0:
            expected.add(kind)
        for i, gen in enumerate(self.la1):
            if gen == self.gen:
                expected |= _LA1[i]
        token = self.peek()
        if token.kind == EOF:
            encountered = TOKEN_IMAGE[EOF]
        else:
            encountered = f' {TOKEN_IMAGE[token.kind]} "{_escape(token.image)} "'
        lines = [f'Encountered "{encountered}" at line {token.line}, column {token.column}.']
        kinds = sorted(expected)
        lines.append("Was expecting:" if len(kinds) == 1 else "Was expecting one of:")
        body = "".join(f"    {TOKEN_IMAGE[k]} ...\n" for k in kinds)
        message = "\n".join(lines) + "\n" + body + "    "
        return Sql92Error(f"org.apache.rocketmq.filter.parser.ParseException: {message}")

    def not_boolean(self, node: _Node) -> Sql92Error:
        return Sql92Error(
            "org.apache.rocketmq.filter.parser.ParseException: "
            f"Expression will not result in a boolean value: {node.text}"
        )

    def as_boolean(self, node: _Node) -> _Node:
        if node.is_bool:
            return node
        if node.kind == "prop":
            return _boolean_cast(node)
        raise self.not_boolean(node)

    # The productions.

    def selector(self) -> _Node:
        return self.as_boolean(self.or_expression())

    def or_expression(self) -> _Node:
        # The operands are checked as the left-deep grammar checks them (the left one at the
        # first OR, then each right one once it is parsed); the chain is built once at the end.
        operands = [self.and_expression()]
        while True:
            if self.ntk() != OR:
                self.la1[0] = self.gen
                return operands[0] if len(operands) == 1 else _chain_all("OR", operands)
            self.consume(OR)
            right = self.and_expression()
            if len(operands) == 1:
                operands[0] = self.as_boolean(operands[0])
            operands.append(self.as_boolean(right))

    def and_expression(self) -> _Node:
        operands = [self.equality_expression()]
        while True:
            if self.ntk() != AND:
                self.la1[1] = self.gen
                return operands[0] if len(operands) == 1 else _chain_all("AND", operands)
            self.consume(AND)
            right = self.equality_expression()
            if len(operands) == 1:
                operands[0] = self.as_boolean(operands[0])
            operands.append(self.as_boolean(right))

    def equality_expression(self) -> _Node:
        left = self.comparison_expression()
        while True:
            kind = self.ntk()
            if kind not in (IS, EQ, NE):
                self.la1[2] = self.gen
                return left
            if kind in (EQ, NE):
                self.consume(kind)
                right = self.comparison_expression()
                _check_equal_operand(left)
                _check_equal_operand(right)
                if (
                    left.kind == "const"
                    and right.kind == "const"
                    and left.is_bool
                    and not right.is_bool
                ):
                    raise _runtime(f"'{left.text}' cannot be compared with '{right.text}'")
                equal = _equal(left, right)
                left = equal if kind == EQ else _not(equal)
                continue
            self.la1[3] = self.gen
            if self.peek(1).kind == NULL:  # LOOKAHEAD(2): IS NULL
                self.consume(IS)
                self.consume(NULL)
                left = _equal(left, _const(None, N, is_bool=True))
            else:
                self.consume(IS)
                self.consume(NOT)
                self.consume(NULL)
                left = _not(_equal(left, _const(None, N, is_bool=True)))

    def comparison_expression(self) -> _Node:
        left = self.unary_expression()
        orders = {GT: ">", GE: ">=", LT: "<", LE: "<="}
        while True:
            kind = self.ntk()
            if kind not in (NOT, BETWEEN, IN, GT, GE, LT, LE):
                self.la1[5] = self.gen
                return left
            if kind in orders:
                self.consume(kind)
                right = self.unary_expression()
                left = _order(left, right, orders[kind])
                continue
            if kind == BETWEEN:
                self.consume(BETWEEN)
                low = self.unary_expression()
                self.consume(AND)
                high = self.unary_expression()
                left = _between(left, low, high, False)
                continue
            self.la1[8] = self.gen
            if kind == NOT and self.peek(1).kind == BETWEEN:  # LOOKAHEAD(2)
                self.consume(NOT)
                self.consume(BETWEEN)
                low = self.unary_expression()
                self.consume(AND)
                high = self.unary_expression()
                left = _between(left, low, high, True)
                continue
            if kind == IN:
                self.consume(IN)
                left = _in(left, self.string_list(6), False)
                continue
            self.la1[9] = self.gen
            if kind == NOT and self.peek(1).kind == IN:  # LOOKAHEAD(2)
                self.consume(NOT)
                self.consume(IN)
                left = _in(left, self.string_list(7), True)
                continue
            raise self.parse_error()

    def string_list(self, choice: int) -> list[str]:
        self.consume(LPAREN)
        values = [self.string_literal()]
        while True:
            if self.ntk() != COMMA:
                self.la1[choice] = self.gen
                break
            self.consume(COMMA)
            values.append(self.string_literal())
        self.consume(RPAREN)
        return values

    def unary_expression(self) -> _Node:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise _too_deep()
        try:
            kind = self.ntk()
            if kind == PLUS and self._scan_unary(self.index + 1) is not None:
                self.consume(PLUS)
                return self.unary_expression()
            if kind == MINUS:
                self.consume(MINUS)
                return _negate(self.unary_expression())
            if kind == NOT:
                self.consume(NOT)
                return _not(self.as_boolean(self.unary_expression()))
            if kind in _LITERALS or kind in (ID, LPAREN):
                return self.primary_expression()
            self.la1[10] = self.gen
            raise self.parse_error()
        finally:
            self.depth -= 1

    def primary_expression(self) -> _Node:
        kind = self.ntk()
        if kind in _LITERALS:
            return self.literal()
        if kind == ID:
            return _prop(self.consume(ID).image)
        if kind == LPAREN:
            self.consume(LPAREN)
            inner = self.or_expression()
            self.consume(RPAREN)
            return inner
        self.la1[11] = self.gen
        raise self.parse_error()

    def literal(self) -> _Node:
        kind = self.ntk()
        if kind == STRING:
            return _const(self.string_literal(), S)
        if kind == DECIMAL:
            image = self.consume(DECIMAL).image
            digits = image[:-1] if image[-1] in "lL" else image
            if _too_long(digits) or int(digits) > LONG_MAX:
                raise Sql92Error(
                    f'java.lang.NumberFormatException: For input string: "{_shown(digits)}"'
                )
            number = int(digits)
            return _const(number, INT if number <= INT_MAX else L)
        if kind == FLOAT:
            image = self.consume(FLOAT).image
            double = float(image)
            if double > 1.7976931348623157e308:
                raise _runtime(f"{image} is greater than 1.7976931348623157E308")
            if double < DOUBLE_MIN_VALUE:
                raise _runtime(f"{image} is less than 4.9E-324")
            return _const(double, D)
        if kind in (TRUE, FALSE):
            self.consume(kind)
            return _const(kind == TRUE, B, is_bool=True)
        if kind == NULL:
            self.consume(NULL)
            return _const(None, N, is_bool=True)
        self.la1[12] = self.gen
        raise self.parse_error()

    def string_literal(self) -> str:
        image = self.consume(STRING).image
        return image[1:-1].replace("''", "'")

    # The syntactic lookahead LOOKAHEAD("+" unaryExpr()): a recogniser over the tokens that
    # builds nothing and records no choice points.  Returns the index after the match or None.

    def _kind_at(self, i: int) -> int:
        return self.peek(i - self.index).kind

    def _scan_unary(self, i: int) -> int | None:
        self.depth += 1
        try:
            if self.depth > MAX_NESTING:
                raise _too_deep()
            return self._scan_unary_at(i)
        finally:
            self.depth -= 1

    def _scan_unary_at(self, i: int) -> int | None:
        for _ in range(MAX_NESTING):
            kind = self._kind_at(i)
            if kind in (PLUS, MINUS, NOT):
                i += 1
                continue
            break
        else:
            raise _too_deep()
        kind = self._kind_at(i)
        if kind in _LITERALS or kind == ID:
            return i + 1
        if kind == LPAREN:
            end = self._scan_or(i + 1)
            if end is not None and self._kind_at(end) == RPAREN:
                return end + 1
        return None

    def _scan_or(self, i: int) -> int | None:
        end = self._scan_and(i)
        while end is not None and self._kind_at(end) == OR:
            nxt = self._scan_and(end + 1)
            if nxt is None:
                break
            end = nxt
        return end

    def _scan_and(self, i: int) -> int | None:
        end = self._scan_equality(i)
        while end is not None and self._kind_at(end) == AND:
            nxt = self._scan_equality(end + 1)
            if nxt is None:
                break
            end = nxt
        return end

    def _scan_equality(self, i: int) -> int | None:
        end = self._scan_comparison(i)
        while end is not None:
            kind = self._kind_at(end)
            nxt: int | None = None
            if kind in (EQ, NE):
                nxt = self._scan_comparison(end + 1)
            elif kind == IS:
                if self._kind_at(end + 1) == NULL:
                    nxt = end + 2
                elif self._kind_at(end + 1) == NOT and self._kind_at(end + 2) == NULL:
                    nxt = end + 3
            if nxt is None:
                break
            end = nxt
        return end

    def _scan_comparison(self, i: int) -> int | None:
        end = self._scan_unary(i)
        while end is not None:
            kind = self._kind_at(end)
            nxt: int | None = None
            if kind in (GT, GE, LT, LE):
                nxt = self._scan_unary(end + 1)
            elif kind == BETWEEN or (kind == NOT and self._kind_at(end + 1) == BETWEEN):
                start = end + (1 if kind == BETWEEN else 2)
                low = self._scan_unary(start)
                if low is not None and self._kind_at(low) == AND:
                    nxt = self._scan_unary(low + 1)
            elif kind == IN or (kind == NOT and self._kind_at(end + 1) == IN):
                j = end + (1 if kind == IN else 2)
                if self._kind_at(j) == LPAREN and self._kind_at(j + 1) == STRING:
                    j += 2
                    while self._kind_at(j) == COMMA and self._kind_at(j + 1) == STRING:
                        j += 2
                    if self._kind_at(j) == RPAREN:
                        nxt = j + 1
            if nxt is None:
                break
            end = nxt
        return end


# -- the compiled filter --------------------------------------------------------------------------


class Sql92Filter:
    """A compiled selector.  ``evaluate(get)`` is Java's evaluate (True, False or None; raises
    nothing: an evaluation Java would abort gives None); ``matches(get)`` is the broker's
    decision (only True matches)."""

    __slots__ = ("_fn", "expression", "properties")

    def __init__(self, expression: str, fn: Fn, properties: frozenset[str]) -> None:
        self.expression = expression
        self._fn = fn
        # The property names the expression reads.
        self.properties = properties

    def evaluate(self, get: Getter) -> bool | None:
        try:
            value = self._fn(get)
        except _EvalError:
            return None
        return value if isinstance(value, bool) else None

    def matches(self, get: Getter) -> bool:
        try:
            return self._fn(get) is True
        except _EvalError:
            return False

    def __repr__(self) -> str:
        return f"Sql92Filter({self.expression!r})"


def compile_sql92(expression: str) -> Sql92Filter:
    """Parse and check ``expression`` as RocketMQ 4.9.4 does and compile it.

    Raises :class:`Sql92Error` (with Java's remark) for an expression Java refuses.
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise Sql92Error(
            f"java.lang.RuntimeException: expression longer than {MAX_EXPRESSION_LENGTH} characters"
        )
    parser = _Parser(expression)
    node = parser.selector()
    names = frozenset(t.image for t in parser.tokens[: parser.index] if t.kind == ID)
    return Sql92Filter(expression, node.fn, names)
