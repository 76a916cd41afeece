#!/usr/bin/env python3
"""Run the commands of README.md and docs/*.md and check what they print (ctest Docs.*).

    tools/check_docs.py --build BUILD [--source DIR] [--mpi] FILE.md...   run and check
    tools/check_docs.py --list FILE.md...                                 list the blocks
    tools/check_docs.py --self-test                                       test this script

The rules a page follows (Note [Doc tests]):

- A command is shown in a ```console block: each line that starts with "$ " is a command (a line
  ending in a backslash continues on the next), the lines under it what it prints, stdout and
  stderr together. The output must match those lines, whole: a line "..." stands for any number of
  lines (none included), "..." inside a line for any text (timings, paths). A command shown with no
  lines under it must only succeed. Every command must exit 0: a page that shows a failure writes
  `; echo "exit $?"` after it, and the status is then one of the lines it prints.
- The commands of a page run in order in one scratch folder (a checkpoint written by one block is
  resumed by the next) whose `build` is the build folder tested and whose other names (examples,
  tools, ...) are the source tree's, so `build/bin/ditto-train` and `examples/data/digits.csv`
  mean what they mean in the README.
- A ```sh, ```bash or ```shell block, and a ```console block that cannot run in CI, carries a
  marker on the line right above its fence, with the reason:
      <!-- doc-test: skip REASON -->            not run (a GPU, apt-get, a long training)
      <!-- doc-test: ci-command -->             the block is exactly what .ci/run runs (checked)
      <!-- doc-test: run "CMD" REASON -->       run CMD instead of the block's one command and
                                                check the block's output (the first command's
                                                setup and build are what CI does itself)
      <!-- doc-test: needs mpi -->              skipped, saying so, when MPI support is not built
      <!-- doc-test: any-order -->              the output lines may come in any order (ranks)
      <!-- doc-test: file PATH -->              the block (any language) is the file PATH, verbatim
  A block of another language (```cpp, ```text, ...) is not run; a ``` block without a language
  whose first line is a "$ " command is refused as an unmarked command.
- A relative link, [text](path), names a file that exists.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SHELL_LANGS = {"sh", "bash", "shell", "console"}
MARKER = re.compile(r"^<!--\s*doc-test:\s*(.*?)\s*-->\s*$")
TIMEOUT_S = 180


class Block:
    def __init__(self, path, line, lang, lines, markers):
        self.path, self.line, self.lang, self.lines, self.markers = path, line, lang, lines, markers

    def where(self):
        return f"{self.path}:{self.line}"

    def marker(self, key):
        for m in self.markers:
            if m == key or m.startswith(key + " "):
                return m[len(key):].strip()
        return None


def parse(path, text=None):
    """The fenced blocks of a Markdown file, with the doc-test markers just above each fence."""
    if text is None:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    lines = text.split("\n")
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(`{3,})\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        markers, j = [], i - 1
        while j >= 0 and MARKER.match(lines[j]):
            markers.insert(0, MARKER.match(lines[j]).group(1))
            j -= 1
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise SystemExit(f"{path}:{start + 1}: a ``` block that is never closed")
        blocks.append(Block(path, start + 1, lang, body, markers))
        i += 1
    return blocks


def commands(block):
    """[(command, [expected lines])] of a console block."""
    out, i, lines = [], 0, block.lines
    while i < len(lines):
        line = lines[i]
        if not line.startswith("$ "):
            if out:
                out[-1][1].append(line.rstrip())
            elif line.strip():
                raise ValueError(f"{block.where()}: a console block's first line must be a '$ ' command,"
                                 f" got '{line}'")
            i += 1
            continue
        cmd = line[2:]
        while cmd.endswith("\\") and i + 1 < len(lines):
            i += 1
            cmd = cmd[:-1] + " " + lines[i].strip().removeprefix("> ")
        out.append((cmd.strip(), []))
        i += 1
    for _, want in out:
        while want and not want[-1]:
            want.pop()
    return out


def line_matches(want, got):
    if "..." not in want:
        return want == got
    parts = [re.escape(p) for p in want.split("...")]
    return re.fullmatch(".*".join(parts), got, re.S) is not None


def output_matches(want, got):
    """want (lines with '...' lines as gaps) matches the whole of got."""
    memo = {}

    def at(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(want):
            r = j == len(got)
        elif want[i] == "...":
            r = any(at(i + 1, k) for k in range(j, len(got) + 1))
        else:
            r = j < len(got) and line_matches(want[i], got[j]) and at(i + 1, j + 1)
        memo[(i, j)] = r
        return r

    return at(0, 0)


def unordered_matches(want, got):
    rest = list(got)
    for w in want:
        if w == "...":
            continue
        hit = next((k for k, g in enumerate(rest) if line_matches(w, g)), None)
        if hit is None:
            return False
        rest.pop(hit)
    return "..." in want or not rest


def scratch_dir(source, build):
    d = tempfile.mkdtemp(prefix="ditto-docs-")
    for name in os.listdir(source):
        if name in ("build", ".git"):
            continue
        # Absolute: a link made of a relative --source (".") would point at itself.
        os.symlink(os.path.join(os.path.abspath(source), name), os.path.join(d, name))
    os.symlink(os.path.abspath(build), os.path.join(d, "build"))
    return d


def run_command(cmd, cwd):
    env = dict(os.environ)
    # mpirun in CI: root, 2 cores (Open MPI's own variables for --allow-run-as-root, --oversubscribe)
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    # Under ASan (the check build, cmake/ditto_checks.cmake): an mpirun command's ranks need
    # LeakSanitizer's slow unwinder, whose stacks reach the Open MPI libraries that
    # tools/sanitizers/lsan.supp names (as the Mpi.* tests, tests/cmake/mpi.cmake). The other
    # commands keep the fast one: the slow one on every malloc made Docs.determinism's runs of
    # ditto-train take 2.7 times the CPU (26.3 s against 9.7 s). LSAN_OPTIONS' later entries
    # win, so a caller's own fast_unwind_on_malloc still does.
    if "LSAN_OPTIONS" in env and re.search(r"\bmpirun\b", cmd):
        env["LSAN_OPTIONS"] = "fast_unwind_on_malloc=0:" + env["LSAN_OPTIONS"]
    p = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def broken_links(path):
    """Relative links of the page (outside code) whose file does not exist."""
    with open(path, encoding="utf-8") as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    text = re.sub(r"`[^`]*`", "", text)
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        if not os.path.exists(os.path.join(os.path.dirname(path), target.split("#")[0])):
            bad.append(target)
    return bad


def check_file(path, args, cwd, report):
    failures = 0
    for target in broken_links(path):
        report(f"FAIL {path}: the link ({target}) names no file")
        failures += 1
    for b in parse(path):
        skip, ci, run_instead = b.marker("skip"), b.marker("ci-command"), b.marker("run")
        shown = b.marker("file")
        if shown is not None:
            with open(os.path.join(args.source, shown), encoding="utf-8") as f:
                content = f.read()
            if "\n".join(b.lines) + "\n" != content:
                report(f"FAIL {b.where()}: the block is not {shown} as it is")
                failures += 1
            else:
                report(f"ok   {b.where()}: shows {shown}")
            continue
        if b.lang not in SHELL_LANGS and not (b.lang == "" and b.lines and b.lines[0].startswith("$ ")):
            continue
        if ci is not None:
            with open(os.path.join(args.source, ".ci/run"), encoding="utf-8") as f:
                ci_text = f.read()
            cmd = "\n".join(line.removeprefix("$ ") for line in b.lines).strip()
            if cmd not in ci_text.split("\n"):
                report(f"FAIL {b.where()}: '{cmd}' is not a line of .ci/run")
                failures += 1
            else:
                report(f"ok   {b.where()}: the command .ci/run runs")
            continue
        if skip is not None:
            if not skip:
                report(f"FAIL {b.where()}: 'doc-test: skip' needs its reason")
                failures += 1
            else:
                report(f"skip {b.where()}: {skip}")
            continue
        if b.lang != "console":
            report(f"FAIL {b.where()}: a ```{b.lang} block of commands is neither run nor marked: write it as"
                   " ```console with $ lines, or mark it <!-- doc-test: skip REASON -->")
            failures += 1
            continue
        if b.marker("needs") == "mpi" and not args.mpi:
            report(f"skip {b.where()}: MPI support is not built")
            continue
        try:
            cmds = commands(b)
        except ValueError as e:
            report(f"FAIL {e}")
            failures += 1
            continue
        if run_instead is not None:
            m = re.match(r'^"([^"]+)"\s*(.*)$', run_instead)
            if not m or len(cmds) != 1 or not m.group(2):
                report(f'FAIL {b.where()}: doc-test: run "CMD" REASON goes with one command')
                failures += 1
                continue
            if not cmds[0][0].endswith(m.group(1)):
                report(f"FAIL {b.where()}: '{m.group(1)}' is not how '{cmds[0][0]}' ends")
                failures += 1
                continue
            cmds = [(m.group(1), cmds[0][1])]
        for cmd, want in cmds:
            t0 = time.monotonic()
            try:
                rc, out = run_command(cmd, cwd)
            except subprocess.TimeoutExpired:
                report(f"FAIL {b.where()}: '{cmd}' ran past {TIMEOUT_S} s")
                failures += 1
                continue
            dt = time.monotonic() - t0
            got = out.rstrip("\n").split("\n") if out.strip() else []
            got = [g.rstrip() for g in got]
            ok = rc == 0
            if ok and want:
                ok = (unordered_matches if b.marker("any-order") is not None else output_matches)(
                    want, got)
            if ok:
                report(f"ok   {b.where()}: {dt:5.1f} s  $ {cmd}")
            else:
                failures += 1
                report(f"FAIL {b.where()}: $ {cmd}\n  exit status {rc}\n  the page shows:\n    "
                       + "\n    ".join(want) + "\n  it printed:\n    " + "\n    ".join(got))
    return failures


def list_file(path):
    for b in parse(path):
        if b.lang in SHELL_LANGS or b.marker("file") is not None or (
                b.lang == "" and b.lines and b.lines[0].startswith("$ ")):
            how = ("file " + b.marker("file") if b.marker("file") is not None else
                   "ci-command" if b.marker("ci-command") is not None else
                   "skip: " + b.marker("skip") if b.marker("skip") is not None else
                   "needs mpi: run" if b.marker("needs") == "mpi" else
                   "run " + b.marker("run") if b.marker("run") is not None else "run")
            first = next((line for line in b.lines if line.strip()), "")
            print(f"{b.where()}: {how}: {first[:90]}")


def self_test():
    page = """x
```console
$ printf 'a\\nb 12 ms\\nc\\n'
a
b ... ms
c
```
<!-- doc-test: any-order -->
```console
$ printf 'r1\\nr0\\n'; echo "exit $?"
r0
r1
exit 0
```
<!-- doc-test: skip needs a GPU -->
```sh
nvidia-smi
```
```console
$ printf '1\\n2\\n3\\n4\\n' | \\
    tail -n 3
...
4
$ false; echo "exit $?"
exit 1
```
"""
    blocks = parse("self", page)
    assert [b.lang for b in blocks] == ["console", "console", "sh", "console"], blocks
    assert commands(blocks[3])[0][0] == "printf '1\\n2\\n3\\n4\\n' |  tail -n 3"
    assert blocks[1].marker("any-order") == "" and blocks[2].marker("skip") == "needs a GPU"
    assert output_matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert output_matches(["a", "...", "b"], ["a", "b"])
    assert not output_matches(["a", "b"], ["a", "b", "c"])
    assert not output_matches(["a ... z"], ["a z"]) and output_matches(["a ...z"], ["a z"])
    assert unordered_matches(["r0", "r1"], ["r1", "r0"]) and not unordered_matches(["r0"], ["r1"])
    with tempfile.TemporaryDirectory() as src:
        for name, text in (("page.md", page), ("bad.md", page.replace("b ... ms", "b 13 ms")),
                           ("plain.md", "```sh\nls\n```\n"), ("bare.md", "```\n$ ls\n```\n"),
                           ("link.md", "[a](page.md) [b](gone.md) [c](https://x.org/y) `[d](e)`\n")):
            with open(os.path.join(src, name), "w") as f:
                f.write(text)
        os.mkdir(os.path.join(src, "build"))
        args = argparse.Namespace(source=src, mpi=False)
        cwd = scratch_dir(src, os.path.join(src, "build"))
        quiet = lambda s: None
        assert check_file(os.path.join(src, "page.md"), args, cwd, quiet) == 0
        assert check_file(os.path.join(src, "bad.md"), args, cwd, quiet) == 1
        assert check_file(os.path.join(src, "plain.md"), args, cwd, quiet) == 1
        assert check_file(os.path.join(src, "bare.md"), args, cwd, quiet) == 1
        assert broken_links(os.path.join(src, "link.md")) == ["gone.md"]
        shutil.rmtree(cwd)
        here = os.getcwd()  # --source given relative to the working directory ("--source .")
        try:
            os.chdir(src)
            cwd = scratch_dir(".", "build")
        finally:
            os.chdir(here)
        assert os.path.isfile(os.path.join(cwd, "page.md")), "a relative --source"
        shutil.rmtree(cwd)
    print("PASS: check_docs.py self-test")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--build", help="the build folder (its bin/ holds ditto-train)")
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--mpi", action="store_true", help="MPI support is built: run mpirun blocks")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.list:
        for f in args.files:
            list_file(f)
        return 0
    if not args.build or not args.files:
        ap.error("--build BUILD and at least one FILE.md")
    failures, t0 = 0, time.monotonic()
    for f in args.files:
        cwd = scratch_dir(args.source, args.build)
        try:
            failures += check_file(f, args, cwd, lambda s: print(s, flush=True))
        finally:
            shutil.rmtree(cwd, ignore_errors=True)
    print(f"{'FAIL' if failures else 'PASS'}: {', '.join(args.files)}: {failures} failure(s) in"
          f" {time.monotonic() - t0:.1f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
