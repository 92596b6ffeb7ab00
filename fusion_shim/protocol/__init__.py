"""What both sides agree on: the wire format (:mod:`.wire`) and content fingerprints (:mod:`.fingerprint`)."""
