"""What the tests share: a broker's topics and records, the counting app, crashes timed on commits,
and damage done to local state."""
