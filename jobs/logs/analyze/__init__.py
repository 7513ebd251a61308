"""Log intelligence: reads engine/build/training logs incrementally for progress, phase, engine, failure cause, serving numbers and warnings.

Stdlib only: the runner process runs this on live logs. The package's parts:
- model: the vocabulary (phases, causes, handler families) and the result dataclasses;
- patterns: the byte anchors of the prefilter, record prefixes, progress/serving/failure patterns, hints;
- signatures: the signature table (one row per signature: pattern, field, priority, releases, example);
  engine and phase patterns are compiled from it, failures are classified by its rows;
  docs/LOG_SIGNATURES.md is generated from it;
- derived_anchors: generated from the table with the doc: the anchors its rows' wording adds, so no
  process start parses the rows' regexes to find them;
- regexcache: the analyzer's regexes' compiled code, cached per machine (the stdlib compiles in Python);
- cause: the root-cause rule (which candidate line names why the run ended);
- generic: what no row knows, read by shape (exceptions by type, build tools' exits, watchdogs, counters);
- state: the state machine one examined log record updates;
- templates: what any segment of one digit-normalised shape can do, learned once per shape;
- scanner: LogAnalyzer, the incremental reader that examines only what can matter;
- envelope: docker's json-file records unwrapped to the text they carry, before the scanner reads a byte.
- parallel: a whole file's byte passes spread over worker processes (`gpudeck analyze -j`), the
  reading still one reader's, in order.

How it stays fast and flat on logs of hundreds of MB:
- bytes are cut into *segments* at every ``\\n`` and ``\\r`` (a tqdm bar rewrites itself
  with ``\\r`` on one physical line; each rewrite is a segment with that line's number);
- what defines the answer (the *reference* scanner, tests/analyze_reference.py, kept out of
  production): every segment with a hit of the anchor prefilter is decoded and examined, in order;
- what runs (the *template* scanner, same answer, much faster): a segment's template is its
  bytes with digits turned into 0, so the thousands of stats lines, bar redraws, build
  steps and NCCL chatter lines of a log share a few templates. Each template is prefiltered
  and classified once (inert / bar redraw / build step / stats line / other); per chunk,
  everything is C-level (translate, split, dict lookups, grouping) except the segments
  whose effect no later segment of the chunk overwrites, which are examined as before.
  Chunks of one-off lines (request ids) fall back to one C-level prefilter pass;
- a segment longer than ``GIANT_SEGMENT`` is examined on its first ``HEAD_BYTES`` and last
  ``TAIL_BYTES`` only, and an incomplete one is kept as head + rolling suffix, so memory is
  bounded whatever the line length (the template cache is bounded too);
- the answer depends only on the bytes, never on how they were split into ``feed()``
  calls, so live (incremental) and whole-file analysis agree.
"""
from __future__ import annotations

from .model import (CAUSES, GIANT_SEGMENT, HEAD_BYTES, PHASES, READ_CHUNK, SERVING_KEYS, TAIL_BYTES, WARNING_CODES,
                    Failure, Family, LogAnalysis, LogWarning, Progress, ServingNumbers)
from .patterns import parse_serving_stats_line
from .scanner import LogAnalyzer, analyze_bytes, analyze_file, analyze_stream
from .templates import TEMPLATE_CACHE_BYTES, TEMPLATE_KEY_MAX, TEMPLATE_ONE_OFFS_MAX, Kind

__all__ = ["CAUSES", "GIANT_SEGMENT", "HEAD_BYTES", "PHASES", "READ_CHUNK", "SERVING_KEYS", "TAIL_BYTES",
           "TEMPLATE_CACHE_BYTES", "TEMPLATE_KEY_MAX", "TEMPLATE_ONE_OFFS_MAX", "WARNING_CODES", "Failure", "Family",
           "Kind", "LogAnalysis", "LogAnalyzer", "LogWarning", "Progress", "ServingNumbers", "analyze_bytes",
           "analyze_file", "analyze_stream", "parse_serving_stats_line"]
