"""What the local worker processes of the trl and loop backends share, owned by neither: the spec a backend's plan
writes and the worker reads (`spec`), the progress line it prints (`progress`), its metrics.jsonl (`metrics`), SIGTERM
handling (`termination`), how a failure becomes the worker protocol (`errors`) and how a step's completions are cut
into forward/backward passes (`batch_layout`)."""
