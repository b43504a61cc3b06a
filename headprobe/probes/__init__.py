"""Probes: retrieval, enhanced-retrieval and retrieval-reasoning head scores; layer retention.

Each probe is a profile kind of a probe pass (:mod:`.registry`, the one list of passes); a pass is its
steps (:mod:`.pass_steps`; the built-in ones in :mod:`.needle_pass` and :mod:`.retention_pass`). A run is
asked for with a :class:`~.request.ProfileRequest`, checked and resolved once (:mod:`.plan`), run pass by
pass (:mod:`.run`), and its logs written as profiles by one writer (:mod:`.outputs`).
"""
