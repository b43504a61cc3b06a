"""``headprobe tune``: the setting that keeps the most accuracy at a memory, found as an eval run as a search.

- :mod:`.space`: the candidates (policies, their selection options, allocations and their option values);
- :mod:`.halving`: successive halving with a paired bootstrap race, and the rung schedule;
- :mod:`.split`: calibration and held-out items;
- :mod:`.memory`: a memory target (share or bytes at a context) as tokens per KV head;
- :mod:`.request`: what a tune is asked (its task and request);
- :mod:`.runner`: the two stages and the held-out eval, every trial an eval trial; :mod:`.races` runs a stage's
  races rung by rung, :mod:`.trial_runs` each batch of trials as one eval run;
- :mod:`.candidates` and :mod:`.space_check`: the candidates checked against the model (before it loads, where its
  shape tells), each made once and each budget resolved once per tune;
- :mod:`.report` and :mod:`.figure`: the report, the chosen budget maps and setting strings, the figure.
"""
