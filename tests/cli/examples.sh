#!/usr/bin/env bash
# Every example of the README (the `$ kiln ...` lines of its console blocks) and of `kiln --help`
# and each command's --help runs, and the README's pasted outputs are what kiln prints (issue 7,
# items 10 and 18). The examples run in a scratch copy of the repository layout: models/,
# examples/ and ../shared/ resolve as they do from the repository root.
source "$(dirname "$0")/lib.bash"

repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$TMP/layout"
rm -rf "$work"
mkdir -p "$work/repo"
ln -s "$repo/models" "$work/repo/models"
ln -s "$repo/examples" "$work/repo/examples"
ln -s "$(dirname "$FIXTURES")" "$work/shared"
# The ONNX files the --help examples name: `kiln inspect`'s model.onnx is the fixture BLOOM
# export, `kiln build`'s are the fixture exports under their own names.
ln -s "$FIXTURES/onnx/bloom.onnx" "$work/repo/model.onnx"
for f in bloom t5_encoder t5_decoder; do ln -s "$FIXTURES/onnx/$f.onnx" "$work/repo/$f.onnx"; done

python3 - "$KILN" "$repo/README.md" "$work/repo" <<'PY' || fail "README and --help examples"
import os, re, subprocess, sys

kiln, readme, cwd = sys.argv[1:4]
kiln = os.path.abspath(kiln)
failures = []
env = dict(os.environ, KILN_BIN=kiln)
env.pop("KILN_LOG_LEVEL", None)


# Paths under /tmp/ in examples (`synth -o /tmp/flan-t5-small`) go to a scratch directory of
# this run, one for the README's and one for the --help examples (both synthesize
# /tmp/flan-t5-small, and synth refuses an existing checkpoint), and back in what is printed:
# runs of this test at the same time, or one after another, never meet in the machine's /tmp.
def scratch_dir(name):
    path = os.path.join(os.path.dirname(cwd), name)
    os.makedirs(path, exist_ok=True)
    return path


scratch = scratch_dir("tmp-readme")


def run(cmd):
    # `kiln` in an example is the binary under test; pipes and quotes work as in a shell.
    script = 'kiln() { "$KILN_BIN" "$@"; }\n' + cmd.replace("/tmp/", scratch + "/")
    r = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                       text=True, errors="replace")
    r.stdout = r.stdout.replace(scratch + "/", "/tmp/")
    r.stderr = r.stderr.replace(scratch + "/", "/tmp/")
    return r


def mask(line):
    # Values that differ from build to build.
    line = re.sub(r'("created_unix": )\d+', r"\1N", line)
    line = re.sub(r'("git_revision": )"[^"]*"', r"\1R", line)
    return re.sub(r"memory [\d.]+ GiB", "memory M GiB", re.sub(r"finished in [\d.]+ s", "finished in T s", line))


def log_message(line):
    return mask(re.sub(r"^\[kiln [DIWE] \d\d:\d\d:\d\d\] ", "", line))


# The README's outputs were made on an AVX-512 CPU: elsewhere kiln packs no weights (no
# pack_weights line, plain layouts), and that is the only difference it allows.
avx512 = "AVX-512" in subprocess.run([kiln, "--version"], capture_output=True, text=True).stdout


def for_this_cpu(lines):
    if avx512:
        return lines
    return [re.sub(r"panel16 for avx512", "plain", l) for l in lines
            if not l.startswith("pack_weights:")]


def check_output(cmd, expected, got, stream):
    exp = for_this_cpu([mask(l) for l in expected])
    out = [mask(l) for l in got]
    if any("..." in l for l in exp):
        # Lines left out: the others must appear in this order.
        pos = 0
        for line in exp:
            if "..." in line:
                continue
            while pos < len(out) and out[pos] != line:
                pos += 1
            if pos == len(out):
                failures.append(f"{cmd}: {stream} lacks (in order) {line!r}")
                return
            pos += 1
    elif exp != out:
        failures.append(f"{cmd}: {stream} differs from the README:\n  README: {exp}\n  kiln:   {out}")


# --- README: console blocks ---
blocks, block = [], None
for line in open(readme, encoding="utf-8").read().splitlines():
    if line.startswith("```console"):
        block = []
    elif line.startswith("```") and block is not None:
        blocks.append(block)
        block = None
    elif block is not None:
        block.append(line)
readme_runs = 0
for lines in blocks:
    steps = []  # (command, expected lines)
    for line in lines:
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    for cmd, expected in steps:
        while expected and expected[-1] == "":
            expected.pop()
        if cmd.startswith("cat "):
            # The README shows an input file: create it as shown.
            with open(os.path.join(cwd, cmd[4:].strip()), "w", encoding="utf-8") as f:
                f.write("\n".join(expected) + "\n")
            continue
        if not cmd.startswith("kiln "):
            failures.append(f"README example is not a kiln command: {cmd}")
            continue
        readme_runs += 1
        r = run(cmd)
        if r.returncode != 0:
            failures.append(f"{cmd}: exit {r.returncode}: {r.stderr[:400]}")
            continue
        logs = [log_message(l) for l in expected if l.startswith("[kiln ")]
        outs = [l for l in expected if not l.startswith("[kiln ")]
        check_output(cmd, outs, r.stdout.splitlines(), "stdout")
        check_output(cmd, logs, [log_message(l) for l in r.stderr.splitlines()], "stderr")

# --- --help of kiln and of every command: the lines under "Example(s):" ---
scratch = scratch_dir("tmp-help")
help_texts = [run("kiln --help").stdout]
commands = re.findall(r"^  (\w+) ", help_texts[0].split("Subcommands:")[-1], re.M)
for c in commands:
    help_texts.append(run(f"kiln {c} --help").stdout)
help_runs = 0
# A build without CUDA cannot make cuda plans: its --help examples that ask for one are skipped
# (saying so); with CUDA compiled in they run, GPU or not.
cuda_built = "cuda: compiled in" in run("kiln --version").stdout
for text in help_texts:
    in_examples = False
    for line in text.splitlines():
        if re.match(r"^\s*Examples?:$", line):
            in_examples = True
            continue
        if in_examples and re.match(r"^\s+kiln ", line):
            cmd = line.strip()
            if "--device cuda" in cmd and not cuda_built:
                print(f"skipped (this kiln has no CUDA): {cmd}")
                continue
            help_runs += 1
            r = run(cmd)
            if r.returncode != 0:
                failures.append(f"--help example {cmd}: exit {r.returncode}: {r.stderr[:400]}")
        else:
            in_examples = False

print(f"{readme_runs} README examples, {help_runs} --help examples ({len(commands)} commands)")
# Guard against an extraction that silently finds nothing.
if readme_runs < 12:
    failures.append(f"only {readme_runs} README examples found")
if help_runs < 12 or len(commands) < 7:
    failures.append(f"only {help_runs} --help examples in {len(commands)} commands found")
for f in failures:
    print("FAIL:", f, file=sys.stderr)
sys.exit(1 if failures else 0)
PY
finish
