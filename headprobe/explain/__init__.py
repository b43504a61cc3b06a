"""``headprobe explain``: any budget, in tokens and bytes, and what every engine allocates for it.

- :mod:`.setting`: the context, batch, dtype and decoding an explanation is for;
- :mod:`.model_shape`: a model's shape without its weights;
- :mod:`.sources`: the inputs (budget map, profiles, DuoAttention folder, HeadKV score file, kvpress press);
- :mod:`.engines`: one module per engine's arithmetic (headprobe's runtime, kvpress, HeadKV,
  KVCache-Factory, DuoAttention), each restated from that engine's code;
- :mod:`.convert`: the budget map equivalent to a DuoAttention pattern, a HeadKV setting or a kvpress ratio;
- :mod:`.explanation`, :mod:`.report`, :mod:`.figure`: the result, as JSON, a terminal table and a figure;
- :mod:`.api`: :func:`explain_budget`, the one entry point.
"""
