#!/usr/bin/env python3
"""check_links.py ROOT: checks the relative links of the repository's Markdown.

Every link `[text](target)` (and `![alt](target)`, and a reference definition
`[label]: target`) in ROOT/README.md and ROOT/docs/*.md whose target is not http(s):// or
mailto: must name a file or folder that exists, relative to the linking file (a target that
starts with / is relative to ROOT). A `#fragment` must match the GitHub anchor of a heading
of the target Markdown file, or of the linking file when the target is only `#fragment`.
A fragment of a file that is not Markdown is not checked. Links inside fenced code blocks and
inline code are not links and are skipped.

GitHub's anchor of a heading: its text as rendered (no backticks, emphasis markers or link
targets), lowercased, every character that is not a letter, digit, space, `-` or `_`
dropped, each space turned into `-`; the second heading with the same anchor gets `-1`, the
third `-2`, and so on. Explicit `<a name="...">` and `id="..."` anchors count too.

Exit status: 0 when every link resolves; 1 with one line per broken link on stderr
(FILE:LINE: TARGET: why); 2 for a wrong command line. Python 3 standard library only.
"""

import os
import re
import sys
import urllib.parse

# A link: [text](target) or [text](<target>), with an optional "title". The text may hold
# one level of brackets ([`a[0]`](x) after inline code is blanked, [see [x]](y)).
LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
    r"\(\s*(<[^>\n]*>|[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"\n]*\"|'[^'\n]*'|\([^)\n]*\)))?\s*\)"
)
REF_DEF = re.compile(r"^ {0,3}\[[^\]\n]+\]:\s*(<[^>\n]*>|\S+)")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
EXPLICIT_ANCHOR = re.compile(r"<a\s[^>]*\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
EXTERNAL = re.compile(r"^(?:https?://|mailto:)", re.I)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def code_spans(line):
    """The (start, end) of every inline code span of a line: a run of backticks up to the
    next run of exactly as many."""
    runs = [(m.start(), m.end()) for m in re.finditer(r"`+", line)]
    spans, i = [], 0
    while i < len(runs):
        start, end = runs[i]
        width = end - start
        close = next((j for j in range(i + 1, len(runs)) if runs[j][1] - runs[j][0] == width), None)
        if close is None:
            i += 1  # a lone run is literal backticks
            continue
        spans.append((start, runs[close][1]))
        i = close + 1
    return spans


def blank_inline_code(line):
    """The line with every inline code span replaced by spaces (columns kept)."""
    for start, end in code_spans(line):
        line = line[:start] + " " * (end - start) + line[end:]
    return line


def prose_lines(text):
    """Yields (line number, line) for the lines outside fenced code blocks. A fence opens
    with three or more backticks or tildes and closes with a line of at least as many of
    the same character and nothing else."""
    fence = None
    for number, line in enumerate(text.split("\n"), start=1):
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
            else:
                yield number, line
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
            fence = None


def heading_text(raw):
    """A heading's text as GitHub renders it, for its anchor: code spans keep their text as it
    is; elsewhere links give their text, and HTML tags and emphasis markers go."""
    parts, last = [], 0
    for start, end in code_spans(raw):
        parts.append((raw[last:start], False))
        parts.append((raw[start:end].strip("`").strip(), True))
        last = end
    parts.append((raw[last:], False))
    out = []
    for text, is_code in parts:
        if not is_code:
            text = re.sub(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", text)
            text = re.sub(r"<[^>]+>", "", text)
            text = re.sub(r"\*+|(?<![A-Za-z0-9])_+|_+(?![A-Za-z0-9])", "", text)
        out.append(text)
    return "".join(out).strip()


def slug(text):
    text = text.lower()
    kept = "".join(c for c in text if c.isalnum() or c in "-_ ")
    return kept.replace(" ", "-")


def anchors_of(text):
    """Every anchor a Markdown file defines."""
    anchors, seen = set(), {}
    previous = None  # the previous prose line, for setext headings

    def add(raw):
        base = slug(heading_text(raw))
        n = seen.get(base, 0)
        seen[base] = n + 1
        anchors.add(base if n == 0 else f"{base}-{n}")

    for _, line in prose_lines(text):
        for m in EXPLICIT_ANCHOR.finditer(line):
            anchors.add(m.group(1))
        m = ATX.match(line)
        if m:
            add(m.group(2) or "")
            previous = None
            continue
        s = SETEXT.match(line)
        if (
            s
            and previous is not None
            and previous.strip()
            and not re.match(r"^\s*([-*+>|]|\d+[.)]\s|#)", previous)
        ):
            add(previous)
            previous = None
            continue
        previous = line
    return anchors


def links_of(text):
    """Yields (line number, target) for every link outside code."""
    for number, line in prose_lines(text):
        prose = blank_inline_code(line)
        m = REF_DEF.match(prose)
        if m:
            yield number, m.group(1)
            continue
        for m in LINK.finditer(prose):
            yield number, m.group(1)


def check(root):
    files = []
    readme = os.path.join(root, "README.md")
    if os.path.isfile(readme):
        files.append(readme)
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(
            os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md") and os.path.isfile(os.path.join(docs, f))
        )
    if not files:
        return [f"{root}: no README.md and no docs/*.md"]

    anchor_cache = {}

    def anchors(path):
        if path not in anchor_cache:
            with open(path, encoding="utf-8") as f:
                anchor_cache[path] = anchors_of(f.read())
        return anchor_cache[path]

    broken = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        shown = os.path.relpath(path, root)
        for number, target in links_of(text):
            where = f"{shown}:{number}: {target}"
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            if EXTERNAL.match(target):
                continue
            if SCHEME.match(target):
                broken.append(f"{where}: not a relative link (only http(s):// and mailto: are external)")
                continue
            if not target:
                broken.append(f"{where}: empty target")
                continue
            file_part, _, fragment = target.partition("#")
            file_part = urllib.parse.unquote(file_part.split("?", 1)[0])
            fragment = urllib.parse.unquote(fragment)
            if file_part:
                base = root if file_part.startswith("/") else os.path.dirname(path)
                resolved = os.path.normpath(os.path.join(base, file_part.lstrip("/")))
            else:
                resolved = path
            if not os.path.exists(resolved):
                broken.append(f"{where}: {os.path.relpath(resolved, root)} does not exist")
                continue
            if fragment and resolved.endswith(".md") and os.path.isfile(resolved):
                if fragment not in anchors(resolved):
                    broken.append(f"{where}: no heading with the anchor #{fragment} in {os.path.relpath(resolved, root)}")
    return broken


def main(argv):
    if len(argv) != 2 or argv[1] in ("-h", "--help"):
        print("usage: check_links.py REPOSITORY_ROOT", file=sys.stderr)
        return 2
    root = argv[1]
    if not os.path.isdir(root):
        print(f"check_links.py: {root} is not a folder", file=sys.stderr)
        return 2
    broken = check(os.path.abspath(root))
    for line in broken:
        print(line, file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
