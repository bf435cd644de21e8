"""The SQL92 selector against RocketMQ 4.9.4's semantics.

Random expressions (hypothesis) are rendered to text, compiled by pymq and evaluated on random
messages; the answer must equal a small tree-walking reference evaluator written here from the
Java expression classes (ComparisonExpression, LogicExpression, UnaryExpression, ...).  Fixed
cases pin each operator with missing and typed properties, and Java's error remarks.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymq.filter.sql92 import Sql92Error, compile_sql92, java_double_str

SAMPLES = "/work/shared/reference/java-wire-samples"

# -- a reference evaluator ----------------------------------------------------------------------
# Values are (java type, python value): ("S", str), ("I", int), ("L", int), ("D", float),
# ("B", bool); None is Java's null.  Errors raise Abort (Java's evaluate throws).


class Abort(Exception):
    pass


@dataclass
class Lit:
    jtype: str
    value: Any
    text: str


@dataclass
class Prop:
    name: str


@dataclass
class Neg:
    operand: Any


@dataclass
class Cmp:
    op: str  # > >= < <= = <>
    left: Any
    right: Any


@dataclass
class Between:
    value: Any
    low: Any
    high: Any
    negate: bool


@dataclass
class InList:
    prop: Prop
    items: list[str]
    negate: bool


@dataclass
class IsNull:
    operand: Any
    negate: bool


@dataclass
class Logic:
    op: str  # AND / OR
    left: Any
    right: Any


@dataclass
class Not:
    operand: Any


@dataclass
class Paren:
    inner: Any


def to_int(text: str, bits: int) -> int:
    s = text
    if (
        not s
        or not (s.lstrip("+-").isdigit() and s.lstrip("+-").isascii())
        or s[:2] in ("+-", "-+")
    ):
        raise Abort
    if s.count("+") + s.count("-") > 1:
        raise Abort
    n = int(s)
    if not -(2 ** (bits - 1)) <= n < 2 ** (bits - 1):
        raise Abort
    return n


def to_double(text: str) -> float:
    s = text.strip("".join(chr(c) for c in range(33)))
    body = s.lstrip("+-") if s[:1] in "+-" else s
    if len(s) - len(body) > 1 or not body:
        raise Abort
    if body == "NaN":
        return math.nan
    if body == "Infinity":
        return -math.inf if s.startswith("-") else math.inf
    if body[-1] in "fFdD":
        body = body[:-1]
    mantissa, _, exponent = body.replace("E", "e").partition("e")
    if exponent:
        exp = exponent[1:] if exponent[0] in "+-" else exponent
        if not exp.isdigit() or not exp.isascii():
            raise Abort
    whole, _, frac = mantissa.partition(".")
    if not (whole + frac) or not (whole + frac).isdigit() or not (whole + frac).isascii():
        raise Abort
    return float(s.rstrip("fFdD") if s[-1] in "fFdD" else s)


def dcmp(a: float, b: float) -> int:
    if a < b:
        return -1
    if a > b:
        return 1

    def bits(x: float) -> int:
        return 0x7FF8000000000000 if x != x else struct.unpack(">q", struct.pack(">d", x))[0]

    return (bits(a) > bits(b)) - (bits(a) < bits(b))


def java_compare(lv: tuple[str, Any], rv: tuple[str, Any]) -> int:  # noqa: C901
    """ComparisonExpression.__compare with convertStringExpressions on."""
    (lt, x), (rt, y) = lv, rv
    if lt != rt:
        if lt == "B":
            if rt == "S":
                raise Abort  # ClassCastException in Java
            return -1
        if lt in ("I", "L"):
            if rt in ("I", "L"):
                pass
            elif rt == "D":
                x, lt = float(x), "D"
            elif rt == "S":
                y, rt = to_int(y, 32 if lt == "I" else 64), lt
            else:
                return -1
        elif lt == "D":
            if rt in ("I", "L"):
                y, rt = float(y), "D"
            elif rt == "S":
                y, rt = to_double(y), "D"
            else:
                return -1
        elif lt == "S":
            if rt == "B":
                x, lt = x.lower() == "true", "B"
            elif rt in ("I", "L"):
                x, lt = to_int(x, 32 if rt == "I" else 64), rt
            elif rt == "D":
                x, lt = to_double(x), "D"
            else:
                return -1
    if lt == "D" or rt == "D":
        return dcmp(x, y)
    if lt == "S":
        a, b = x.encode("utf-16-be"), y.encode("utf-16-be")
        return (a > b) - (a < b)
    return (x > y) - (x < y)


def ev(node: Any, props: dict[str, str]) -> Any:  # noqa: C901
    """Java's evaluate: a typed value, a Python bool/None for boolean expressions."""
    if isinstance(node, Lit):
        return None if node.value is None else (node.jtype, node.value)
    if isinstance(node, Prop):
        v = props.get(node.name)
        return None if v is None else ("S", v)
    if isinstance(node, Paren):
        return ev(node.inner, props)
    if isinstance(node, Neg):
        v = ev(node.operand, props)
        if v is None or v[0] not in ("I", "L", "D"):
            return None
        return (v[0], -v[1])
    if isinstance(node, Cmp):
        lv = ev(node.left, props)
        if node.op in ("=", "<>"):
            rv = ev(node.right, props)
            lv, rv = boxed(lv), boxed(rv)
            if (lv is None) != (rv is None):
                eq = None if lv is None else False
            elif lv is None:
                eq = True
            else:
                eq = java_compare(lv, rv) == 0
            if node.op == "=":
                return eq
            return None if eq is None else not eq
        if lv is None:
            return None
        rv = ev(node.right, props)
        if rv is None:
            return None
        lv, rv = boxed(lv), boxed(rv)
        if lv[0] == "S" and rv[0] == "S":
            c = dcmp(to_double(lv[1]), to_double(rv[1]))
        else:
            c = java_compare(lv, rv)
        return {">": c > 0, ">=": c >= 0, "<": c < 0, "<=": c <= 0}[node.op]
    if isinstance(node, Between):
        if node.negate:
            return ev(
                Logic("OR", Cmp("<", node.value, node.low), Cmp(">", node.value, node.high)),
                props,
            )
        return ev(
            Logic("AND", Cmp(">=", node.value, node.low), Cmp("<=", node.value, node.high)), props
        )
    if isinstance(node, InList):
        v = props.get(node.prop.name)
        if v is None:
            return None
        return (v in node.items) != node.negate
    if isinstance(node, IsNull):
        v = ev(node.operand, props)
        return (v is not None) if node.negate else (v is None)
    if isinstance(node, Logic):
        lv = as_bool(ev(node.left, props), node.left)
        if node.op == "AND":
            if lv is False:
                return False
            rv = as_bool(ev(node.right, props), node.right)
            if rv is False:
                return False
            return None if lv is None or rv is None else True
        if lv is True:
            return True
        rv = as_bool(ev(node.right, props), node.right)
        if rv is True:
            return True
        return None if lv is None or rv is None else False
    if isinstance(node, Not):
        v = as_bool(ev(node.operand, props), node.operand)
        return None if v is None else not v
    raise AssertionError(node)


def boxed(v: Any) -> Any:
    if isinstance(v, bool):
        return ("B", v)
    return v


def as_bool(v: Any, node: Any) -> Any:
    """asBooleanExpression: a property is cast (its string is never TRUE)."""
    while isinstance(node, Paren):
        node = node.inner
    if isinstance(node, Prop):
        return None if v is None else False
    if isinstance(v, tuple):
        return v[1] if v[0] == "B" else None
    return v


def reference(node: Any, props: dict[str, str]) -> bool:
    try:
        v = as_bool(ev(node, props), node)
    except Abort:
        return False
    return v is True


def render(node: Any) -> str:
    if isinstance(node, Lit):
        return node.text
    if isinstance(node, Prop):
        return node.name
    if isinstance(node, Paren):
        return f"({render(node.inner)})"
    if isinstance(node, Neg):
        return f"-{render(node.operand)}"
    if isinstance(node, Cmp):
        return f"{render(node.left)} {node.op} {render(node.right)}"
    if isinstance(node, Between):
        n = "NOT " if node.negate else ""
        return f"{render(node.value)} {n}between {render(node.low)} AND {render(node.high)}"
    if isinstance(node, InList):
        items = ", ".join("'" + i.replace("'", "''") + "'" for i in node.items)
        return f"{node.prop.name} {'not ' if node.negate else ''}IN ({items})"
    if isinstance(node, IsNull):
        return f"{render(node.operand)} IS {'NOT ' if node.negate else ''}NULL"
    if isinstance(node, Logic):
        return f"({render(node.left)}) {node.op.lower()} ({render(node.right)})"
    if isinstance(node, Not):
        return f"NOT ({render(node.operand)})"
    raise AssertionError(node)


# -- strategies ---------------------------------------------------------------------------------

NAMES = ["a", "b", "c", "TAGS"]
VALUES = [
    "1", "5", "-3", "+7", "007", "2.5", "5.0", "1e3", "NaN", "-Infinity", "9999999999", "abc",
    "", "x", "X", "true", "TRUE", "false", " 5", "3f", "0.0", "-0.0", "it's", "2147483648",
]  # fmt: skip

props_st = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=4)
prop_st = st.sampled_from(NAMES).map(Prop)


@st.composite
def number_st(draw: Any) -> Any:
    kind = draw(st.sampled_from(["int", "long", "double", "neg"]))
    if kind == "int":
        n = draw(st.integers(0, 2**31 - 1))
        return Lit("I", n, str(n))
    if kind == "long":
        n = draw(st.integers(2**31, 2**63 - 1))
        return Lit("L", n, str(n) + draw(st.sampled_from(["", "L", "l"])))
    if kind == "double":
        text = draw(st.sampled_from(["2.5", "5.", ".5", "1e3", "1.5E-2", "5.0", "3E1"]))
        return Lit("D", float(text), text)
    inner = draw(number_st())
    return Neg(inner)


value_st = st.one_of(
    prop_st,
    number_st(),
    st.sampled_from(["x", "abc", "5", "", "it's"]).map(
        lambda s: Lit("S", s, "'" + s.replace("'", "''") + "'")
    ),
    st.sampled_from([True, False]).map(lambda b: Lit("B", b, "TRUE" if b else "FALSE")),
)


@st.composite
def comparison_st(draw: Any) -> Any:
    form = draw(st.sampled_from(["order", "eq", "between", "in", "isnull"]))
    if form == "order":
        left = draw(st.one_of(prop_st, number_st()))
        right = (
            draw(prop_st) if not isinstance(left, Prop) else draw(st.one_of(prop_st, number_st()))
        )
        return Cmp(draw(st.sampled_from([">", ">=", "<", "<="])), left, right)
    if form == "eq":
        left, right = draw(value_st), draw(value_st)
        if (
            isinstance(left, Lit)
            and left.jtype == "B"
            and isinstance(right, Lit)
            and right.jtype != "B"
        ):
            left, right = right, left
        return Cmp(draw(st.sampled_from(["=", "<>"])), left, right)
    if form == "between":
        low, high = draw(number_st()), draw(number_st())
        if (
            isinstance(low, Lit)
            and isinstance(high, Lit)
            and java_compare((high.jtype, high.value), (low.jtype, low.value)) < 0
        ):
            low, high = high, low
        return Between(draw(prop_st), low, high, draw(st.booleans()))
    if form == "in":
        items = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=6))
        return InList(draw(prop_st), items, draw(st.booleans()))
    return IsNull(draw(st.one_of(prop_st, number_st())), draw(st.booleans()))


boolean_st = st.recursive(
    st.one_of(comparison_st(), prop_st),
    lambda children: st.one_of(
        st.builds(Logic, st.sampled_from(["AND", "OR"]), children, children),
        st.builds(Not, children),
        st.builds(Paren, children),
    ),
    max_leaves=8,
)


@settings(max_examples=600, deadline=None)
@given(boolean_st, st.lists(props_st, min_size=1, max_size=6))
def test_random_expressions_match_the_reference(tree: Any, messages: list[dict[str, str]]) -> None:
    text = render(tree)
    compiled = compile_sql92(text)
    for props in messages:
        assert compiled.matches(props.get) is reference(tree, props), (text, props)


# -- fixed cases --------------------------------------------------------------------------------


def m(expression: str, **props: str) -> bool:
    return compile_sql92(expression).matches(props.get)


@pytest.mark.parametrize(
    "expression, props, expected",
    [
        # Numbers: a property converts to the literal's type.
        ("a > 5", {"a": "6"}, True),
        ("a > 5", {"a": "5"}, False),
        ("a > 5", {}, False),
        ("a > 5", {"a": "6.5"}, False),  # Integer.valueOf("6.5") throws
        ("a > 5.0", {"a": "6.5"}, True),
        ("a > 5", {"a": "abc"}, False),
        ("a > 5", {"a": "9999999999"}, False),  # not an int
        ("a > 5L", {"a": "9999999999"}, False),  # 5L is still an int literal
        ("a > 2147483648", {"a": "9999999999"}, True),  # a long literal
        ("a >= 5", {"a": "5"}, True),
        ("a < -1", {"a": "-2"}, True),
        ("a <= 1e1", {"a": "10"}, True),
        ("a = 5", {"a": "005"}, True),
        ("a = 5", {"a": "+5"}, True),
        ("a <> 5", {"a": "6"}, True),
        ("a <> 5", {}, False),  # unknown, not true
        ("a > b", {"a": "10", "b": "9.5"}, True),  # two properties: as doubles
        ("a > b", {"a": "10", "b": "x"}, False),
        # Strings: only = and <>.
        ("a = 'x'", {"a": "x"}, True),
        ("a = 'x'", {"a": "X"}, False),
        ("a <> 'x'", {"a": "y"}, True),
        ("a = b", {"a": "x", "b": "x"}, True),
        ("a = b", {"a": "x"}, False),
        ("a <> b", {"a": "x"}, True),  # a null on the right only: false, so <> is true
        ("a <> b", {"b": "x"}, False),
        ("'x' = a", {"a": "x"}, True),
        # Booleans.
        ("a = TRUE", {"a": "true"}, True),
        ("a = TRUE", {"a": "TRUE"}, True),
        ("a = FALSE", {"a": "yes"}, True),  # Boolean.valueOf("yes") is false
        ("TRUE = a", {"a": "true"}, False),  # ClassCastException in Java
        ("TRUE", {}, True),
        ("FALSE", {}, False),
        ("NULL", {}, False),
        ("a", {"a": "true"}, False),  # a property is never TRUE
        ("NOT a", {"a": "x"}, True),
        ("NOT a", {}, False),
        # BETWEEN, IN, IS NULL.
        ("a between 1 and 3", {"a": "3"}, True),
        ("a between 1 and 3", {"a": "4"}, False),
        ("a not between 1 and 3", {"a": "4"}, True),
        ("a not between 1 and 3", {}, False),
        ("a between -5 and 5", {"a": "-5"}, True),
        ("a in ('x', 'y')", {"a": "y"}, True),
        ("a in ('x', 'y')", {}, False),
        ("a not in ('x', 'y')", {"a": "z"}, True),
        ("a not in ('x', 'y')", {}, False),
        ("a in ('it''s')", {"a": "it's"}, True),
        ("a is null", {}, True),
        ("a is null", {"a": ""}, False),
        ("a is not null", {"a": ""}, True),
        ("a = ''", {"a": ""}, True),
        # Three-valued logic; an aborted comparison aborts the whole expression.
        ("a > 1 or b = 'x'", {"b": "x"}, True),
        ("a > 1 and b = 'x'", {"b": "x"}, False),
        ("not (a > 1)", {}, False),
        ("a = 5 or b = 'x'", {"a": "abc", "b": "x"}, False),
        ("b = 'x' or a = 5", {"a": "abc", "b": "x"}, True),  # short-circuit before the abort
        # TAGS is a property like any other.
        ("TAGS = 'TagA'", {"TAGS": "TagA"}, True),
        # Doubles as Java compares them.
        ("a > 1.5", {"a": "NaN"}, True),  # Double.compare puts NaN above everything
        ("a = 0.5", {"a": "5e-1"}, True),
        ("a > 1.5", {"a": "2d"}, True),
        ("a > 1.5", {"a": "0x1p1"}, True),
        # Case, comments, whitespace.
        ("A > 1 AnD a < 3", {"A": "2", "a": "2"}, True),
        ("a > 1 -- a comment\n", {"a": "2"}, True),
        ("a /* note */ > 1", {"a": "2"}, True),
        ("\ta\r\n>\f1", {"a": "2"}, True),
        # What follows a complete expression is ignored, as Java's parser ignores it.
        ("a > 1 b c", {"a": "2"}, True),
        ("a = 012", {"a": "0"}, True),
    ],
)
def test_operator_semantics(expression: str, props: dict[str, str], expected: bool) -> None:
    assert compile_sql92(expression).matches(props.get) is expected


def test_evaluate_is_three_valued() -> None:
    f = compile_sql92("a > 1")
    assert f.evaluate({"a": "2"}.get) is True
    assert f.evaluate({"a": "0"}.get) is False
    assert f.evaluate({}.get) is None
    assert f.evaluate({"a": "x"}.get) is None  # Java threw
    assert compile_sql92("a > 1 and (b = 'x' or c is null)").properties == {"a", "b", "c"}


def test_the_java_broker_remark_for_a_bad_expression() -> None:
    with open(f"{SAMPLES}/SQL92-CHECK_CLIENT_CONFIG-46-bad-expression.request-body.json") as f:
        expression = json.load(f)["subscriptionData"]["subString"]
    with open(f"{SAMPLES}/SQL92-CHECK_CLIENT_CONFIG-46-bad-expression.response-header.json") as f:
        remark = json.load(f)["remark"]
    with pytest.raises(Sql92Error) as info:
        compile_sql92(expression)
    assert info.value.remark == remark


P = "org.apache.rocketmq.filter.parser.ParseException: "
T = "org.apache.rocketmq.filter.parser.TokenMgrError: "
R = "java.lang.RuntimeException: "
PRIMARY = (
    '    "NOT" ...\n    "TRUE" ...\n    "FALSE" ...\n    "NULL" ...\n    <DECIMAL_LITERAL> ...\n'
    "    <FLOATING_POINT_LITERAL> ...\n    <STRING_LITERAL> ...\n    <ID> ...\n"
    '    "(" ...\n    "-" ...\n    '
)


@pytest.mark.parametrize(
    "expression, remark",
    [
        ("a > ", P + 'Encountered "<EOF>" at line 1, column 4.\nWas expecting one of:\n' + PRIMARY),
        ("", P + 'Encountered "<EOF>" at line 0, column 0.\nWas expecting one of:\n' + PRIMARY),
        (
            "a IN (1)",
            P + 'Encountered " <DECIMAL_LITERAL> "1 "" at line 1, column 7.\n'
            "Was expecting:\n    <STRING_LITERAL> ...\n    ",
        ),
        (
            "a IS b",
            P
            + 'Encountered " <ID> "b "" at line 1, column 6.\nWas expecting:\n    "NOT" ...\n    ',
        ),
        (
            "a\nand )",
            P + 'Encountered " ")" ") "" at line 2, column 5.\nWas expecting one of:\n' + PRIMARY,
        ),
        ("5", P + "Expression will not result in a boolean value: 5"),
        ("a = 1 and 5", P + "Expression will not result in a boolean value: 5"),
        ("-a", P + "Expression will not result in a boolean value: (- a)"),
        ("a # 1", T + 'Lexical error at line 1, column 3.  Encountered: "#" (35), after : ""'),
        ("a = #", T + 'Lexical error at line 1, column 6.  Encountered: <EOF> after : ""'),
        ("a = 'x", T + 'Lexical error at line 1, column 7.  Encountered: <EOF> after : "\\\'x"'),
        ("a.b = 1", T + 'Lexical error at line 1, column 3.  Encountered: "b" (98), after : "."'),
        ("a > 0.0", R + "0.0 is less than 4.9E-324"),
        ("a > 1 > 2", R + "Value '(a > 1)' cannot be compared."),
        ("a > 'x'", R + "Value ''x'' cannot be compared."),
        ("a > TRUE", R + "Value 'TRUE' cannot be compared."),
        ("a = NULL", R + "'NULL' cannot be compared."),
        ("TRUE = 1", R + "'TRUE' cannot be compared with '1'"),
        ("5 IN ('x')", R + "Expected a property for In expression, got: 5"),
        (
            "a between 3 and 1",
            R + "Illegal values of between, left value(3) must less than or "
            "equal to right value(1)",
        ),
        ("a between NULL and 1", R + "Illegal values of between, values can not be null!"),
        (
            "a between 'x' and 1",
            R + 'java.lang.NumberFormatException: For input string: "x"',
        ),
        (
            "a > 99999999999999999999",
            'java.lang.NumberFormatException: For input string: "99999999999999999999"',
        ),
    ],
)
def test_refusals_carry_javas_remark(expression: str, remark: str) -> None:
    with pytest.raises(Sql92Error) as info:
        compile_sql92(expression)
    assert info.value.remark == remark


def test_limits() -> None:
    with pytest.raises(Sql92Error):
        compile_sql92("(" * 500 + "a" + ")" * 500)
    with pytest.raises(Sql92Error):
        compile_sql92("a = 1 or " * 10000 + "a = 1")


def test_java_double_to_string() -> None:
    assert [java_double_str(v) for v in (1.0, 1e7, 1.5e-4, 123.25, -0.0, 1e300)] == [
        "1.0", "1.0E7", "1.5E-4", "123.25", "-0.0", "1.0E300",
    ]  # fmt: skip


def test_a_long_chain_compiles_in_time_linear_in_its_length() -> None:
    """A node per AND/OR once made a chain of n terms cost n^2 (seconds at the length cap, on
    the event loop): the chain is built once.  Counted in operations, not timed."""
    from pymq.filter import sql92

    built: list[int] = []
    real = sql92._chain_all

    def counting(op: str, operands: list) -> object:
        built.append(len(operands))
        return real(op, operands)

    sql92._chain_all = counting  # type: ignore[assignment]
    try:
        compiled = sql92.compile_sql92(" OR ".join(["a = 1"] * 3000))
    finally:
        sql92._chain_all = real  # type: ignore[assignment]
    assert built == [3000]  # one chain of all the terms, not 2999 growing ones
    assert compiled.matches({"a": "1"}.get) and not compiled.matches({"a": "2"}.get)


_CAST = (
    "error: class java.lang.Boolean cannot be cast to class java.lang.String (java.lang.Boolean "
    "and java.lang.String are in module java.base of loader 'bootstrap')"
)
_EQUAL_PROPS = [
    {},
    {"a": "x"},
    {"a": "5"},
    {"a": "1.5"},
    {"a": "true"},
    {"b": "x"},
    {"a": "x", "b": "x"},
    {"a": "5", "b": "4"},
    {"a": "1", "b": "1"},
    {"a": "1000"},
]


@pytest.mark.parametrize(
    "expression, results",
    [
        ("a is null", [True, False, False, False, False, True, False, False, False, False]),
        ("5 is null", [False, False, False, False, False, False, False, False, False, False]),
        ("'x' is not null", [True, True, True, True, True, True, True, True, True, True]),
        ("TRUE is null", [False, False, False, False, False, False, False, False, False, False]),
        ("(a) is null", [True, False, False, False, False, True, False, False, False, False]),
        ("- a is null", [True, True, True, True, True, True, True, True, True, True]),
        ("a = 'x'", [None, True, False, False, False, None, True, False, False, False]),
        ("a <> 'x'", [None, False, True, True, True, None, False, True, True, True]),
        (
            "a = 5",
            [
                None,
                'error: For input string: "x"',
                True,
                'error: For input string: "1.5"',
                'error: For input string: "true"',
                None,
                'error: For input string: "x"',
                True,
                False,
                False,
            ],
        ),
        (
            "a = 2147483648",
            [
                None,
                'error: For input string: "x"',
                False,
                'error: For input string: "1.5"',
                'error: For input string: "true"',
                None,
                'error: For input string: "x"',
                False,
                False,
                False,
            ],
        ),
        (
            "a = 1.5",
            [
                None,
                'error: For input string: "x"',
                False,
                True,
                'error: For input string: "true"',
                None,
                'error: For input string: "x"',
                False,
                False,
                False,
            ],
        ),
        ("a = TRUE", [None, False, False, False, True, None, False, False, False, False]),
        ("a <> FALSE", [None, False, False, False, True, None, False, False, False, False]),
        ("a = b", [True, False, False, False, False, None, True, False, True, False]),
        ("a <> b", [False, True, True, True, True, None, False, True, False, True]),
        (
            "5 = a",
            [
                False,
                'error: For input string: "x"',
                True,
                'error: For input string: "1.5"',
                'error: For input string: "true"',
                False,
                'error: For input string: "x"',
                True,
                False,
                False,
            ],
        ),
        ("'x' = a", [False, True, False, False, False, False, True, False, False, False]),
        ("TRUE = a", [False, _CAST, _CAST, _CAST, _CAST, False, _CAST, _CAST, _CAST, _CAST]),
        ("a + 1 = 2", [None, False, False, False, False, None, False, False, False, False]),
        ("a = b + 1", [True, False, False, False, False, None, True, False, True, False]),
        (
            "(a = 1) = (b = 2)",
            [
                True,
                'error: For input string: "x"',
                False,
                'error: For input string: "1.5"',
                'error: For input string: "true"',
                'error: For input string: "x"',
                'error: For input string: "x"',
                True,
                False,
                False,
            ],
        ),
        ("- a = -5", [None, None, None, None, None, None, None, None, None, None]),
        (
            "a = 1e3",
            [
                None,
                'error: For input string: "x"',
                False,
                False,
                'error: For input string: "true"',
                None,
                'error: For input string: "x"',
                False,
                False,
                True,
            ],
        ),
        ("'1' = 1", [True, True, True, True, True, True, True, True, True, True]),
        ("(a = 1) > 2", "java.lang.RuntimeException: Value '(a == 1)' cannot be compared."),
        ("a = NULL", "java.lang.RuntimeException: 'NULL' cannot be compared."),
        ("NULL = a", "java.lang.RuntimeException: 'NULL' cannot be compared."),
    ],
)
def test_equality_and_is_null_answer_as_java(expression: str, results: list[object] | str) -> None:
    """=, <> and IS [NOT] NULL over each kind of operand, against fixed property sets: the
    three-valued answer (None is SQL's unknown), the evaluation error's text, or the remark of
    an expression refused at compile time."""
    from pymq.filter.sql92 import _EvalError

    if isinstance(results, str):
        with pytest.raises(Sql92Error) as info:
            compile_sql92(expression)
        assert info.value.remark == results
        return
    compiled = compile_sql92(expression)
    got: list[object] = []
    for props in _EQUAL_PROPS:
        try:
            got.append(compiled._fn(props.get))
        except _EvalError as exc:
            got.append(f"error: {exc}")
    assert got == results


@pytest.mark.parametrize(
    "text, tokens",
    [
        (
            "a > 1 -- c\n",
            [
                ("<ID>", "a", 1, 1),
                ('">"', ">", 1, 3),
                ("<DECIMAL_LITERAL>", "1", 1, 5),
                ("<EOF>", "", 1, 11),
            ],
        ),
        (
            "a > 1 -- c",
            [
                ("<ID>", "a", 1, 1),
                ('">"', ">", 1, 3),
                ("<DECIMAL_LITERAL>", "1", 1, 5),
                ('"-"', "-", 1, 7),
                ('"-"', "-", 1, 8),
                ("<ID>", "c", 1, 10),
                ("<EOF>", "", 1, 10),
            ],
        ),
        (
            "a /* x */ = 1",
            [
                ("<ID>", "a", 1, 1),
                ('"="', "=", 1, 11),
                ("<DECIMAL_LITERAL>", "1", 1, 13),
                ("<EOF>", "", 1, 13),
            ],
        ),
        (
            "a /* x",
            [
                ("<ID>", "a", 1, 1),
                T + 'Lexical error at line 1, column 7.  Encountered: <EOF> after : "/* x"',
            ],
        ),
        ("/* a */", [("<EOF>", "", 1, 7)]),
        (
            "a\n\tb  = 'it''s'",
            [
                ("<ID>", "a", 1, 1),
                ("<ID>", "b", 2, 9),
                ('"="', "=", 2, 12),
                ("<STRING_LITERAL>", "'it''s'", 2, 14),
                ("<EOF>", "", 2, 20),
            ],
        ),
        (".", [T + 'Lexical error at line 1, column 2.  Encountered: <EOF> after : ""']),
        (".x", [T + 'Lexical error at line 1, column 3.  Encountered: <EOF> after : ".x"']),
        ("1.", [("<FLOATING_POINT_LITERAL>", "1.", 1, 1), ("<EOF>", "", 1, 2)]),
        (".5e3", [("<FLOATING_POINT_LITERAL>", ".5e3", 1, 1), ("<EOF>", "", 1, 4)]),
        ("1e5", [("<FLOATING_POINT_LITERAL>", "1e5", 1, 1), ("<EOF>", "", 1, 3)]),
        ("10L", [("<DECIMAL_LITERAL>", "10L", 1, 1), ("<EOF>", "", 1, 3)]),
        (
            "01",
            [
                ("<DECIMAL_LITERAL>", "0", 1, 1),
                ("<DECIMAL_LITERAL>", "1", 1, 2),
                ("<EOF>", "", 1, 2),
            ],
        ),
        (
            "1..2",
            [
                ("<FLOATING_POINT_LITERAL>", "1.", 1, 1),
                ("<FLOATING_POINT_LITERAL>", ".2", 1, 3),
                ("<EOF>", "", 1, 4),
            ],
        ),
        (
            "1.e",
            [("<FLOATING_POINT_LITERAL>", "1.", 1, 1), ("<ID>", "e", 1, 3), ("<EOF>", "", 1, 3)],
        ),
        (
            "a / b",
            [
                ("<ID>", "a", 1, 1),
                T + 'Lexical error at line 1, column 4.  Encountered: " " (32), after : "/"',
            ],
        ),
        ("/", [T + 'Lexical error at line 1, column 2.  Encountered: <EOF> after : ""']),
        ("/x", [T + 'Lexical error at line 1, column 3.  Encountered: <EOF> after : "/x"']),
        (
            "x.y",
            [
                ("<ID>", "x", 1, 1),
                T + 'Lexical error at line 1, column 4.  Encountered: <EOF> after : ".y"',
            ],
        ),
        (
            "a # b",
            [
                ("<ID>", "a", 1, 1),
                T + 'Lexical error at line 1, column 3.  Encountered: "#" (35), after : ""',
            ],
        ),
        ("é", [T + 'Lexical error at line 1, column 2.  Encountered: <EOF> after : ""']),
        (
            "é b",
            [T + 'Lexical error at line 1, column 1.  Encountered: "\\u00e9" (233), after : ""'],
        ),
        (
            "a <> b >= c <= d < e > f = (g, h) + - ",
            [
                ("<ID>", "a", 1, 1),
                ('"<>"', "<>", 1, 3),
                ("<ID>", "b", 1, 6),
                ('">="', ">=", 1, 8),
                ("<ID>", "c", 1, 11),
                ('"<="', "<=", 1, 13),
                ("<ID>", "d", 1, 16),
                ('"<"', "<", 1, 18),
                ("<ID>", "e", 1, 20),
                ('">"', ">", 1, 22),
                ("<ID>", "f", 1, 24),
                ('"="', "=", 1, 26),
                ('"("', "(", 1, 28),
                ("<ID>", "g", 1, 29),
                ('","', ",", 1, 30),
                ("<ID>", "h", 1, 32),
                ('")"', ")", 1, 33),
                ('"+"', "+", 1, 35),
                ('"-"', "-", 1, 37),
                ("<EOF>", "", 1, 38),
            ],
        ),
        ("$x _y", [("<ID>", "$x", 1, 1), ("<ID>", "_y", 1, 4), ("<EOF>", "", 1, 5)]),
        (
            "a\r\nb\rc",
            [("<ID>", "a", 1, 1), ("<ID>", "b", 2, 1), ("<ID>", "c", 3, 1), ("<EOF>", "", 3, 1)],
        ),
        ("'abc", [T + 'Lexical error at line 1, column 5.  Encountered: <EOF> after : "\\\'abc"']),
        ("--\n--", [('"-"', "-", 2, 1), ('"-"', "-", 2, 2), ("<EOF>", "", 2, 2)]),
        (
            "-- only",
            [('"-"', "-", 1, 1), ('"-"', "-", 1, 2), ("<ID>", "only", 1, 4), ("<EOF>", "", 1, 7)],
        ),
        (
            "a = 1 /**/",
            [
                ("<ID>", "a", 1, 1),
                ('"="', "=", 1, 3),
                ("<DECIMAL_LITERAL>", "1", 1, 5),
                ("<EOF>", "", 1, 10),
            ],
        ),
        (
            "a = 1 /* * / */ and b",
            [
                ("<ID>", "a", 1, 1),
                ('"="', "=", 1, 3),
                ("<DECIMAL_LITERAL>", "1", 1, 5),
                ('"AND"', "and", 1, 17),
                ("<ID>", "b", 1, 21),
                ("<EOF>", "", 1, 21),
            ],
        ),
        (
            "NOT and Or between IN true False null iS",
            [
                ('"NOT"', "NOT", 1, 1),
                ('"AND"', "and", 1, 5),
                ('"OR"', "Or", 1, 9),
                ('"BETWEEN"', "between", 1, 12),
                ('"IN"', "IN", 1, 20),
                ('"TRUE"', "true", 1, 23),
                ('"FALSE"', "False", 1, 28),
                ('"NULL"', "null", 1, 34),
                ('"IS"', "iS", 1, 39),
                ("<EOF>", "", 1, 40),
            ],
        ),
        ("", [("<EOF>", "", 0, 0)]),
        ("   ", [("<EOF>", "", 1, 3)]),
        ("\n", [("<EOF>", "", 1, 1)]),
    ],
)
def test_lexer_tokens_and_positions(text: str, tokens: list[object]) -> None:
    """Each token's kind, image, line and column as JavaCC's SelectorParserTokenManager gives
    them (comments and blanks skipped, tabs to 8), or the TokenMgrError that ends the text."""
    from pymq.filter.sql92 import TOKEN_IMAGE, _Lexer

    lexer = _Lexer(text)
    got: list[object] = []
    try:
        while True:
            token = lexer.next_token()
            got.append((TOKEN_IMAGE[token.kind], token.image, token.line, token.column))
            if token.kind == 0:
                break
    except Sql92Error as exc:
        got.append(exc.remark)
    assert got == tokens
