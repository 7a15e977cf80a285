"""Source code as HTML with syntax colours, for report.html: no dependency, no script.

Python (tk's kernels, Inductor's Triton kernels and modules) is split by the standard
``tokenize`` module; C++ (Inductor's CPU kernels) by a few regular expressions.  Each token
becomes a ``<span>`` of a class (``CLASSES``) that report.html's style sheet colours; every
line is a ``<span class="line">`` of its own, numbered by the style sheet.
"""

from __future__ import annotations

import builtins
import html
import io
import keyword
import re
import tokenize

# class -> what it marks (report.html's CSS gives each a colour)
CLASSES = {
    "k": "keyword", "s": "string", "c": "comment", "n": "number", "d": "decorator",
    "f": "the name a def or class defines", "b": "a Python builtin", "t": "triton.language (tl.*)",
    "p": "preprocessor line (C++)",
}  # fmt: skip
_BUILTINS = set(dir(builtins))


def _python_segments(source: str) -> list[tuple[str, str]]:
    """(text, class) pieces that put together give ``source`` back; class "" is plain text."""
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(row_col):
        row, col = row_col
        return starts[row - 1] + col if row - 1 < len(starts) else len(source)

    out, at, previous, before_previous, decorator = [], 0, None, None, False
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.ENDMARKER:
            break
        begin, end = offset(tok.start), offset(tok.end)
        if begin < at:  # tokenize's DEDENT/NEWLINE bookkeeping: nothing to colour
            continue
        cls = ""
        decorator = decorator and (tok.type == tokenize.NAME or tok.string == ".")  # @triton.jit: to "(" or the end
        if decorator:
            cls = "d"
        elif tok.type == tokenize.COMMENT:
            cls = "c"
        elif tok.type == tokenize.STRING or tok.type in _F_STRING_PARTS:
            cls = "s"
        elif tok.type == tokenize.NUMBER:
            cls = "n"
        elif tok.type == tokenize.NAME:
            if previous is not None and previous.string in ("def", "class"):
                cls = "f"
            elif previous is not None and previous.string == "." and before_previous is not None and before_previous.string == "tl":
                cls = "t"
            elif keyword.iskeyword(tok.string) or tok.string in ("self", "cls"):
                cls = "k"
            elif tok.string in _BUILTINS:
                cls = "b"
        elif tok.type == tokenize.OP and tok.string == "@" and (previous is None or previous.type in _LINE_ENDS):
            cls, decorator = "d", True
        out.append((source[at:begin], ""))
        out.append((source[begin:end], cls))
        at = end
        if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            previous, before_previous = tok, previous
        elif tok.type in _LINE_ENDS:
            previous, before_previous = tok, None
    out.append((source[at:], ""))
    return out


_LINE_ENDS = (tokenize.NL, tokenize.NEWLINE)
_F_STRING_PARTS = tuple(getattr(tokenize, n) for n in ("FSTRING_START", "FSTRING_MIDDLE", "FSTRING_END") if hasattr(tokenize, n))

_CPP = re.compile(
    r"(?P<c>//[^\n]*|/\*.*?\*/)|(?P<p>^[ \t]*#[^\n]*)|(?P<s>\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*')"
    r"|(?P<n>\b\d[\w.]*\b)|(?P<k>\b(?:auto|bool|break|case|char|const|constexpr|continue|do|double|else|extern|float|for"
    r"|if|inline|int|long|return|short|signed|sizeof|static|struct|switch|template|typename|unsigned|using|void"
    r"|volatile|while|int64_t|int32_t|uint8_t|size_t)\b)",
    re.S | re.M,
)


def _cpp_segments(source: str) -> list[tuple[str, str]]:
    out, at = [], 0
    for m in _CPP.finditer(source):
        out.append((source[at : m.start()], ""))
        out.append((m.group(), m.lastgroup or ""))
        at = m.end()
    out.append((source[at:], ""))
    return out


def segments(source: str, language: str) -> list[tuple[str, str]]:
    """(text, class) pieces of ``source``; plain text where the language is unknown or does not tokenize."""
    try:
        if language == "python":
            return _python_segments(source)
        if language == "cpp":
            return _cpp_segments(source)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return [(source, "")]


def to_html(source: str, language: str) -> str:
    """``<pre class="code">`` of ``source``: a ``<span class="line">`` per line, coloured spans inside it."""
    lines, current = [], []
    for text, cls in segments(source, language):
        pieces = text.split("\n")
        for i, piece in enumerate(pieces):
            if i:
                lines.append("".join(current))
                current = []
            if piece:
                escaped = html.escape(piece, quote=False)
                current.append(f'<span class="{cls}">{escaped}</span>' if cls else escaped)
    if current:
        lines.append("".join(current))
    body = "\n".join(f'<span class="line">{line}</span>' for line in lines)
    return f'<pre class="code {html.escape(language)}"><code>{body}</code></pre>'


def language_of(path: str) -> str:
    return {"py": "python", "cpp": "cpp", "h": "cpp", "cu": "cpp"}.get(path.rsplit(".", 1)[-1], "text")
