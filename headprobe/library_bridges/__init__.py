"""Optional bridges to other libraries; each module imports its library and is imported only on request.

- :mod:`headprobe.library_bridges.kvpress`: kvpress presses that read headprobe budget maps, profiles and
  DuoAttention pattern folders (``pip install "headprobe[kvpress]"``).
"""
