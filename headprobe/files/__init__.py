"""Files headprobe writes and reads: atomic JSON, validators, trial logs, overwrite checks."""
