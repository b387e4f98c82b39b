#!/usr/bin/python3
"""Runs rdma-core's test suite (Debian python3-pyverbs) and records every test's outcome.

Usage (inside `softnic exec`, from tests/pyverbs/run):
    runner.py TESTS_DIR RESULTS_TSV -- [run_tests.py arguments, e.g. --dev NIC --gid 1 -v]

TESTS_DIR is an unpacked copy of /usr/share/doc/rdma-core/tests. The suite is loaded
exactly as its own run_tests.py loads it (the package `tests`, every test_*.py module);
the only difference is the result object, which also writes one line per test to
RESULTS_TSV: `test id <TAB> pass|fail|error|skip|xfail|xpass <TAB> reason`.
"""
import os
import sys
import unittest
from importlib.machinery import SourceFileLoader


class RecordingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rows = []

    def _row(self, test, outcome, reason=''):
        reason = ' '.join(str(reason).split())
        self.rows.append((test.id(), outcome, reason[:300]))

    def addSuccess(self, test):
        super().addSuccess(test)
        self._row(test, 'pass')

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._row(test, 'fail', err[1])

    def addError(self, test, err):
        super().addError(test, err)
        self._row(test, 'error', '%s: %s' % (err[0].__name__, err[1]))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._row(test, 'skip', reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._row(test, 'xfail', err[1])

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._row(test, 'xpass')


def main():
    tests_dir, results = sys.argv[1], sys.argv[2]
    if sys.argv[3] != '--':
        sys.exit('usage: runner.py TESTS_DIR RESULTS_TSV -- [run_tests.py args]')
    sys.argv = [os.path.join(tests_dir, 'run_tests.py')] + sys.argv[4:]
    sys.path.insert(0, tests_dir)
    from args_parser import parser
    tests = SourceFileLoader('tests', os.path.join(tests_dir, '__init__.py')).load_module()
    parser.parse_args()
    runner = unittest.TextTestRunner(verbosity=2, resultclass=RecordingResult)
    prog = unittest.main(module=tests, testRunner=runner, exit=False, argv=sys.argv)
    with open(results, 'w') as f:
        for row in sorted(prog.result.rows):
            f.write('\t'.join(row) + '\n')


if __name__ == '__main__':
    main()
