"""The lease + signal-queue protocol as code: the model every backend is held to
(:mod:`.state` and :mod:`.model`) and its exhaustive checker (:mod:`.explore`,
``make model-check``). docs/protocol.md is the same protocol in prose and tables."""
