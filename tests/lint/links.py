#!/usr/bin/env python3
"""Link check of the documentation (make lint).

Every relative link of README.md and docs/*.md, inline ([text](target)) or
by reference ([label]: target), must name a file or folder of the repository;
a link with #anchor must name a heading of the target markdown file (GitHub's
slugs) or an explicit <a id=...>/<a name=...> there. Links to other schemes
(https:, mailto:) are not checked, nor anything inside code blocks or code
spans. Prints one line per broken link and exits 1 if there is any.

    tests/lint/links.py [FILE.md ...]      default: README.md docs/*.md
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FENCE = re.compile(r'^\s*(```|~~~)')
INLINE = re.compile(r'!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)')
REFDEF = re.compile(r'^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+"[^"]*")?\s*$')
CODESPAN = re.compile(r'(`+)(.+?)\1')
HEADING = re.compile(r'^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$')
HTML_ID = re.compile(r'<a\s+[^>]*(?:id|name)\s*=\s*"([^"]+)"', re.I)
SCHEME = re.compile(r'^[a-zA-Z][a-zA-Z0-9+.-]*:')


def lines_outside_code(path):
    """(line number, text) of every line outside fenced code blocks."""
    fence = None
    with open(path, encoding='utf-8') as f:
        for n, line in enumerate(f, 1):
            m = FENCE.match(line)
            if m:
                if fence is None:
                    fence = m.group(1)
                elif m.group(1) == fence:
                    fence = None
                continue
            if fence is None:
                yield n, line.rstrip('\n')


def slug(text):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', text)  # links: their text
    text = re.sub(r'<[^>]+>', '', text)                      # inline HTML
    text = text.replace('`', '').strip().lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        for _, line in lines_outside_code(path):
            for a in HTML_ID.findall(line):
                found.add(a)
            m = HEADING.match(line)
            if not m:
                continue
            s = slug(m.group(2))
            k = seen.get(s, 0)
            seen[s] = k + 1
            found.add(s if k == 0 else '%s-%d' % (s, k))
        _anchors[path] = found
    return _anchors[path]


def check(md):
    broken = []
    rel = os.path.relpath(md, ROOT)
    for n, line in lines_outside_code(md):
        text = CODESPAN.sub('', line)
        targets = INLINE.findall(text)
        m = REFDEF.match(text)
        if m:
            targets.append(m.group(1))
        for t in targets:
            if SCHEME.match(t) or t.startswith('//'):
                continue
            path, _, frag = t.partition('#')
            if path.startswith('/'):
                target = os.path.join(ROOT, path.lstrip('/'))
            elif path:
                target = os.path.normpath(os.path.join(os.path.dirname(md), path))
            else:
                target = md
            if not os.path.exists(target):
                broken.append('%s:%d: %s: no such file or folder' % (rel, n, t))
                continue
            if frag and target.endswith('.md') and os.path.isfile(target):
                if frag not in anchors(target):
                    broken.append('%s:%d: %s: no heading #%s in %s'
                                  % (rel, n, t, frag, os.path.relpath(target, ROOT)))
    return broken


def main(argv):
    if argv:
        files = [os.path.abspath(a) for a in argv]
    else:
        docs = os.path.join(ROOT, 'docs')
        files = [os.path.join(ROOT, 'README.md')] + sorted(
            os.path.join(docs, f) for f in os.listdir(docs) if f.endswith('.md'))
    broken = []
    for f in files:
        broken += check(f)
    for b in broken:
        print(b)
    if broken:
        print('links: %d broken in %d files' % (len(broken), len(files)))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
