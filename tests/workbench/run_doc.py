"""Run a page's Python blocks in order, in one namespace, as a reader following it would.

    python tests/workbench/run_doc.py docs/debugging.md     (from the repository's root)

A ```python block is executed; the ```text or ```pdb block right after it is what it should
print.  A ```pdb block's "(Pdb) <command>" lines are the debugger's input while its Python
block runs (stdin); its other lines, and a ```text block's lines, are expected output.  Each
block is written to a file of its own first and run from it, as a reader runs a script: Triton
reads a kernel's source from its file, and the debugger lists the lines it stops at.  Prints a
JSON list: per Python block, its output, the commands it was fed, the lines expected, and its
error if it raised.
"""

import contextlib
import io
import json
import re
import sys
import tempfile
import traceback
from pathlib import Path

FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.S | re.M)
PROMPT = "(Pdb) "


def blocks(page: str) -> list[dict]:
    """The Python blocks of ``page``, each with the debugger input and the output the next block expects."""
    found = []
    for m in FENCE.finditer(page):
        kind, body = m.group(1), m.group(2)
        if kind == "python":
            found.append({"source": body, "commands": [], "expected": [], "line": page[: m.start()].count("\n") + 2})
        elif kind in ("text", "pdb") and found and not found[-1]["expected"] and not found[-1]["commands"]:
            for line in body.splitlines():
                if kind == "pdb" and line.startswith(PROMPT):
                    found[-1]["commands"].append(line[len(PROMPT) :])
                elif line.strip():
                    found[-1]["expected"].append(line.strip())
    return found


def run(path: str, folder: Path) -> list[dict]:
    namespace = {"__name__": "__main__"}
    results = []
    for i, block in enumerate(blocks(open(path).read())):
        name = f"{path}, block {i + 1} (line {block['line']})"
        file = folder / f"block_{i + 1}.py"
        file.write_text(block["source"])
        out = io.StringIO()
        sys.stdin = io.StringIO("".join(c + "\n" for c in block["commands"]))
        error = None
        with contextlib.redirect_stdout(out):
            try:
                exec(compile(block["source"], str(file), "exec"), namespace)
            except BaseException:  # noqa: BLE001 - reported, with the rest of the page not run
                error = traceback.format_exc()
        results.append({**block, "name": name, "output": out.getvalue(), "error": error})
        if error:
            break
    return results


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(run(sys.argv[1], Path(folder))))
