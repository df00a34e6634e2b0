"""The one schema version of every file and record scaleguard writes.

History:
  1: one run per case and torch version in baselines; per-step samples only.
  2: runs are first-class: baselines keep the last K accepted runs per case and torch version,
     each with its median, spread, session, date and commit; schema-1 files load as one run
     each and are written back as 2. Run records carry quarantine reasons and a run id.
"""

from __future__ import annotations

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
