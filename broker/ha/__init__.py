"""Hot spare (issue 20): the witness, terms and the election rules (docs/ha.md)."""
