#!/usr/bin/python3
"""Prints the tables of docs/pyverbs.md from a run's results and the rxe reference.

Usage: tests/pyverbs/table.py RESULTS_TSV [RXE_RESULTS]

RESULTS_TSV is the `results.tsv` of a `PYVERBS_KEEP=1 tests/pyverbs/run` (test id, outcome,
reason); RXE_RESULTS (default: rxe-6.1-results.txt next to this script) is the suite run on
Linux rxe, one `ok|ERROR|FAIL|skipped test-id` line per test. Prints: counts, the per-module
table, the skip reasons with their counts, and every test with softnic's and rxe's outcome.
"""
import collections
import os
import sys


def main():
    results = sys.argv[1]
    rxe_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), 'rxe-6.1-results.txt')
    rows = []
    for line in open(results):
        f = line.rstrip('\n').split('\t')
        rows.append((f[0], f[1], f[2] if len(f) > 2 else ''))
    rxe = {}
    for line in open(rxe_path):
        f = line.split()
        if len(f) == 2:
            rxe[f[1]] = {'ok': 'pass', 'skipped': 'skip'}.get(f[0], f[0].lower())
    counts = collections.Counter(o for _, o, _ in rows)
    print('softnic: %d tests, %s' % (len(rows), ', '.join(
        '%d %s' % (counts[k], k) for k in sorted(counts))))
    rc = collections.Counter(rxe.values())
    print('rxe: %d tests, %s' % (len(rxe), ', '.join(
        '%d %s' % (rc[k], k) for k in sorted(rc))))
    both = sum(1 for t, o, _ in rows if o == 'pass' and rxe.get(t) == 'pass')
    print('pass on both: %d; pass on rxe only: %s; pass on softnic only: %s' % (
        both,
        [t for t, o, _ in rows if o != 'pass' and rxe.get(t) == 'pass'],
        [t for t, o, _ in rows if o == 'pass' and rxe.get(t) != 'pass']))
    print()
    kinds = ['pass', 'fail', 'error', 'skip']
    print('| module | pass | fail | error | skip | total | rxe pass |')
    print('|---|---:|---:|---:|---:|---:|---:|')
    mods = collections.OrderedDict()
    for t, o, _ in rows:
        mods.setdefault(t.split('.')[1], []).append((t, o))
    for m, ts in mods.items():
        c = collections.Counter(o for _, o in ts)
        rp = sum(1 for t, _ in ts if rxe.get(t) == 'pass')
        print('| `%s` | %s | %d | %d |' % (m, ' | '.join(str(c[k]) for k in kinds), len(ts), rp))
    print('| **all** | %s | **%d** | **%d** |' % (
        ' | '.join('**%d**' % counts[k] for k in kinds), len(rows), rc['pass']))
    print()
    reasons = collections.Counter(r for _, o, r in rows if o != 'pass')
    print('| tests | the suite\'s reason |')
    print('|---:|---|')
    for r, n in reasons.most_common():
        print('| %d | %s |' % (n, r))
    print()
    print('| test | softnic | rxe | why (the suite\'s skip reason or assertion) |')
    print('|---|---|---|---|')
    for t, o, r in rows:
        print('| `%s` | %s | %s | %s |' % (t[len('tests.'):], o, rxe.get(t, '-'), r))


if __name__ == '__main__':
    main()
