# Copyright 2026 The flax-tieext Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.


"""Adds up the JUnit reports of the nox sessions that .ci/run ran.

Usage: python3 .ci/summary.py REPORTS_DIR

REPORTS_DIR holds <session>/<run>.xml (noxfile.py writes them). Prints one
line per run, in the order they ran, then the total as the closing line,
``ci: N passed, N failed, N skipped`` (errors count as failed).
Exits 1 if any test failed or errored, or if there is no report at all.
"""

import collections
import pathlib
import sys
import xml.etree.ElementTree as ET

import harness  # .ci/harness.py, next to this script


def main(argv):
  reports = pathlib.Path(argv[1])
  xmls = list(reports.glob('*/*.xml'))
  # Sessions in the order they ran; runs by name within a session.
  first = {}
  for xml in xmls:
    first[xml.parent] = min(first.get(xml.parent, float('inf')), xml.stat().st_mtime)
  xmls.sort(key=lambda x: (first[x.parent], x.stem))
  total = collections.Counter()
  print(f'\n===== test counts of the nox sessions ({reports}) =====')
  for xml in xmls:
    try:
      counts = harness.counts(harness.outcomes(xml))
    except ET.ParseError as e:
      counts = harness.counts({xml.stem: 'error'})
      print(f'{xml}: unreadable report ({e})')
    total.update(counts)
    print(f'  {xml.parent.name:<16} {xml.stem:<22} {harness.describe(counts)}')
  failed = total['failed'] + total['error']
  print(f'ci: {total["passed"]} passed, {failed} failed, {total["skipped"]} skipped')
  return 1 if failed or not xmls else 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
