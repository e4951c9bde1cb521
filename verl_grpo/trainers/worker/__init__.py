"""What the local worker processes of the trl and loop backends share, owned by neither: the spec a backend's plan
writes and the worker reads (`spec`), the progress line it prints (`progress`), its metrics.jsonl (`metrics`), SIGTERM
handling (`termination`) and how a failure becomes the worker protocol (`errors`)."""
