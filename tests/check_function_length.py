#!/usr/bin/python3
"""check_function_length.py ROOT [--self-test]: no function body longer than
120 lines in the sharding and checkpoint layers (src/strategy/, src/tp/,
src/checkpoint/, include/loom/strategy/): a longer one does several things,
and each deserves a name (issue 38).

A function body is a brace block opened at namespace or class scope after a
parameter list (a `)` then perhaps qualifiers, an initializer list or a
trailing return type); lambdas and local classes inside it count as its
lines. Comments, string and character literals are blanked first, so their
braces do not count. Prints each function over the limit with its length
and exits 1 if there is any; --self-test checks the scanner on planted code."""
import os
import re
import sys

LIMIT = 120
AREAS = ["src/strategy", "src/tp", "src/checkpoint", "include/loom/strategy"]
SCOPE_KEYWORDS = re.compile(r"\b(namespace|class|struct|union|enum|extern)\b")
QUALIFIERS = re.compile(r"((const|noexcept|override|final|mutable|try|&&|&)\s*)*")


def blank_literals(text):
    """text with comments, strings and character literals replaced by spaces
    (newlines kept, so line numbers stay)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            open_paren = text.find("(", i)
            delimiter = text[i + 2:open_paren]
            j = text.find(")" + delimiter + '"', open_paren)
            j = n if j < 0 else j + len(delimiter) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum() and text[i - 1] not in "uUL"):
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        else:
            out.append(c)
            i += 1
    # Preprocessor lines (with their continuations) say nothing about scopes.
    return re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)),
                  "".join(out))


def classify(head):
    """What a brace opened at namespace or class scope after `head` opens."""
    h = " ".join(head.split())
    if re.search(r"\bconcept\b", h) or re.search(r"=\s*$", h):
        return "inner"  # a concept's requirements, an initializer
    if SCOPE_KEYWORDS.search(h) and ")" not in h:
        return "scope"
    if ")" not in h:
        return "inner"
    after = h[h.rindex(")") + 1:].strip()
    if QUALIFIERS.fullmatch(after) or "->" in after or after.endswith("}"):
        return "function"
    return "init"  # a member's brace initializer in a constructor's list


def long_functions(text, limit=LIMIT):
    """[(first line, length, head)] of the function bodies longer than limit."""
    code = blank_literals(text)
    found = []
    # Each open brace: is it a scope (namespace, class) or a function body, or inside one?
    stack = []  # entries: ("scope" | "function" | "inner", line of the brace, head)
    statement_start = 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c in ";":
            if not stack or stack[-1][0] == "scope":
                statement_start = i + 1
        elif c == "{":
            if stack and stack[-1][0] in ("function", "inner"):
                stack.append(("inner", line, ""))
                continue
            head = code[statement_start:i]
            kind = classify(head)
            stack.append((kind, line, " ".join(head.split())[-90:] if kind == "function" else ""))
            if kind == "scope":
                statement_start = i + 1
        elif c == "}":
            if not stack:
                continue
            kind, start, head = stack.pop()
            if kind == "function" and line - start + 1 > limit:
                found.append((start, line - start + 1, head))
            if kind != "init" and (not stack or stack[-1][0] == "scope"):
                statement_start = i + 1
    return found


def self_test():
    short = "namespace a {\nint f(int x) {\n" + "  x += 1;\n" * 10 + "  return x;\n}\n}\n"
    long_body = "struct s {\n  void g() const {\n    auto l = [] { return '}'; };\n" + \
        "    // } a comment brace\n    const char* t = \"{{\";\n" * 70 + "  }\n};\n"
    assert long_functions(short, 120) == [], long_functions(short, 120)
    got = long_functions(long_body, 120)
    assert len(got) == 1 and got[0][0] == 2 and got[0][1] == 143, got
    ctor = "x::x(int a)\n    : b_(a), c_{a} {\n" + "  ++b_;\n" * 130 + "}\n"
    assert len(long_functions(ctor, 120)) == 1, long_functions(ctor, 120)
    return 0


def main():
    if "--self-test" in sys.argv:
        return self_test()
    root = sys.argv[1]
    failures = 0
    for area in AREAS:
        for directory, _, names in os.walk(os.path.join(root, area)):
            for name in sorted(names):
                if not name.endswith((".cpp", ".hpp")):
                    continue
                path = os.path.join(directory, name)
                with open(path, encoding="utf-8") as f:
                    for start, length, head in long_functions(f.read()):
                        print(f"{os.path.relpath(path, root)}:{start}: {length} lines (limit {LIMIT}): {head}")
                        failures += 1
    if failures:
        print(f"{failures} function(s) over {LIMIT} lines: split each along its seams, one name per step")
        return 1
    self_test()
    print(f"function_length: no function over {LIMIT} lines in {', '.join(AREAS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
