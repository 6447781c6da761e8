#!/usr/bin/env python3
"""Turns a report written by ckcheck into a golden file for tests/reports: numbers that vary
between machines (floating-point values and integers of two digits or more, such as ULP distances and counts) and the version
become {{num}} / {{bytes}} / {{any}} placeholders; everything else must match exactly.

    python3 scripts/make_golden.py REPORT > tests/reports/golden/NAME.golden
"""
import re
import sys

FLOAT = re.compile(r'(?<![\w.])-?(?:\d+\.\d+(?:e[-+]?\d+)?|\d+e[-+]?\d+|\d{2,})(?![\w.])')
VERSION = re.compile(r'(ckcheck |"version": ")\d+\.\d+\.\d+')

# What differs between machines: what the build was made against, the clocks the platform offers,
# and what time measurements decide.
BUILD = re.compile(r'^(\s*"(?:ckcheck|libtorch|cuda|cuda_version|clock|instructions_ratio|recommendation|'
                   r'recommendation_reason|too_noisy)": ).*?(,?)$')

# The ops around a divergence (diagnose) follow LibTorch's decompositions, which change between
# versions: their rows match anything, but their number must not change.
OP_ROW = re.compile(r'^(\s+>?\s+)\d+\s+\S.*$')
# Paths of the build tree (the test ops library) differ between checkouts.
BUILD_PATH = re.compile(r'/\S*/libckcheck_test_ops\.so')

def convert(line):
    line = BUILD_PATH.sub('{{any}}', line)
    line = OP_ROW.sub(lambda m: m.group(1) + '{{any}}', line.rstrip('\n')) + '\n'
    line = BUILD.sub(lambda m: m.group(1) + '{{any}}' + m.group(2), line.rstrip('\n')) + '\n'
    line = VERSION.sub(lambda m: m.group(1) + '{{any}}', line)
    line = re.sub(r'("seconds": )[^,\n]+', r'\1{{num}}', line)
    line = re.sub(r'^(cost: ).*$', r'\1{{any}}', line)  # the console's cost line: CPU times
    line = re.sub(r'(time=")[^"]*(")', r'\1{{num}}\2', line)
    line = FLOAT.sub('{{num}}', line)
    # A size's unit follows it too (0 B, 8.0 KiB).
    line = re.sub(r'(\{\{num\}\}|\b\d) (B|KiB|MiB|GiB|TiB)\b', '{{bytes}}', line)
    # A duration's unit follows its size (845 us, 1.2 ms).
    return re.sub(r'(\{\{num\}\}|\b\d) (ns|us|ms|s)\b', r'{{num}} {{unit}}', line)

def convert_json_context(lines):
    """Inside a JSON "context" array (the op rows), every value matches anything."""
    depth = 0
    for line in lines:
        if depth == 0 and re.match(r'^\s*"context": \[\s*$', line):
            depth = 1
            yield line
            continue
        if depth:
            depth += line.count('[') + line.count('{') - line.count(']') - line.count('}')
            if depth > 0:
                line = re.sub(r'^(\s*"\w+": ).*?(,?)$', lambda m: m.group(1) + '{{any}}' + m.group(2), line.rstrip('\n')) + '\n'
                line = re.sub(r'^(\s*)(?!")[^\s\[\]{}].*?(,?)$', lambda m: m.group(1) + '{{any}}' + m.group(2), line.rstrip('\n')) + '\n'
            else:
                depth = 0
        yield line

with open(sys.argv[1]) as f:
    for line in convert_json_context(f):
        sys.stdout.write(convert(line))
