#!/usr/bin/env python3
"""Turns a report written by ckcheck into a golden file for tests/reports: numbers that vary
between machines (floating-point values and integers of two digits or more, such as ULP distances and counts) and the version
become {{num}} / {{any}} placeholders; everything else must match exactly.

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

def convert(line):
    line = BUILD.sub(lambda m: m.group(1) + '{{any}}' + m.group(2), line.rstrip('\n')) + '\n'
    line = VERSION.sub(lambda m: m.group(1) + '{{any}}', line)
    line = re.sub(r'("seconds": )[^,\n]+', r'\1{{num}}', line)
    line = re.sub(r'(time=")[^"]*(")', r'\1{{num}}\2', line)
    return FLOAT.sub('{{num}}', line)

with open(sys.argv[1]) as f:
    for line in f:
        sys.stdout.write(convert(line))
